// The progress watchdog (parallel.timeout): every blocking MPI wait in Relay goes through
// Watchdog::wait, which polls the request and, once it has waited `timeout` seconds, asks every other
// rank what it is doing over a communicator of its own. A rank answers at its next poll point: any
// wait, and every schedule action, eval batch and checkpoint tensor (progress()). So:
//   - a rank that is working (writing a large checkpoint, a long eval, a slow first step) answers
//     "working" within one poll interval, and the waiters simply keep waiting: slow is not stalled;
//   - a rank that is waiting but made progress within the timeout (rank 0 streaming a checkpoint, between
//     receiving one tensor and the next) is moving too;
//   - a rank that stopped (SIGSTOP, a wedged GPU kernel, a dead link, a swapping node) does not answer
//     within the grace period, and the job ends with one line naming it and what was waited for:
//     "rank 2 (stage 1, replica 0) made no progress for 600 s while rank 0 waited for its activation
//     of micro-batch 3 at step 118", then MPI_Abort (exit code 1 on every rank that can still run).
// The rank's own thread runs the watchdog; with parallel.overlap the progress thread (comm/progress.hpp) tests the
// collectives' requests, and the rank's thread waits on their completion flags here (wait_until), watched the same
// way. timeout = 0 turns it off: plain MPI_Wait (or polling the flag).
#pragma once
#include <mpi.h>

#include <atomic>
#include <deque>
#include <functional>
#include <string>
#include <vector>

namespace relay {

class Watchdog {
 public:
  // world: the job's communicator (duplicated here). describe(rank) names a rank for messages,
  // "rank 2 (stage 1, replica 0)". timeout_s <= 0: off.
  Watchdog(MPI_Comm world, double timeout_s, std::function<std::string(int)> describe);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout() const { return timeout_; }
  // What this rank is doing, for the answers it gives ("step 118").
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& context() const { return context_; }
  // The main thread finished a piece of work: answers pending questions.
  void progress();
  // Waits for req like MPI_Wait. what: what is waited for ("its activation of micro-batch 3");
  // peer: the world rank it comes from, or -1 (a collective).
  void wait(MPI_Request* req, const std::string& what, int peer = -1);
  // The same for a request another thread completes: done() turns true once it is (it must not call MPI here).
  void wait_until(const std::function<bool()>& done, const std::string& what, int peer = -1);
  // Seconds since this rank last made progress (read by the NCCL watchdog thread).
  double seconds_since_progress() const;

 private:
  struct Reply {
    int rank = -1;
    int working = 0;       // 1: between poll points of real work; 0: waiting in communication
    double idle_s = 0;     // seconds since its last progress
    char what[224] = {};   // what it is waiting for, or its context
  };
  void service();  // answer questions, collect garbage
  void answer(int to, int round, bool waiting, const std::string& what);
  [[noreturn]] void end_job(const std::vector<int>& silent, const std::vector<Reply>& replies, double waited,
                            const std::string& what, int peer);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_;
  std::function<std::string(int)> describe_;
  std::string context_;
  std::atomic<double> last_progress_;
  int round_ = 0;
  bool waiting_ = false;
  std::string waiting_for_;
  struct Pending {
    MPI_Request req;
    std::vector<char> buf;
  };
  std::deque<Pending> sends_;
};

// The job's watchdog, installed by the trainer for the length of a run (null: plain MPI waits).
void set_active_watchdog(Watchdog* w);
Watchdog* active_watchdog();
// MPI_Wait through the active watchdog, if any.
void watchdog_wait(MPI_Request* req, const std::string& what, int peer = -1);
// Waits until done() through the active watchdog, if any (else polls it).
void watchdog_wait_until(const std::function<bool()>& done, const std::string& what, int peer = -1);
// Reports progress to the active watchdog, if any.
void watchdog_progress();

}  // namespace relay
