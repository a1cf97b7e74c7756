// The progress thread (parallel.overlap, issue 40). Open MPI moves a non-blocking collective only while some thread is
// inside an MPI call ("OMPI progress: no" in ompi_info), so a gradient all-reduce started before a backward would sit
// until the rank next enters MPI. One thread per rank takes the requests of the non-blocking collectives of the
// communicators that ask for it (Communicator::set_background_progress: the data-parallel ones) and tests
// them (MPI_Testsome) every poll interval, so they advance while the rank's own thread runs oneDNN; the rank's thread
// then waits on a completion flag, through the progress watchdog (comm/watchdog.hpp) as before: a stopped or dead peer
// still ends the job within parallel.timeout, naming it. Needs MPI_THREAD_MULTIPLE (the rank's thread keeps making
// its own MPI calls: pipeline messages, the watchdog's questions). The measurements behind the design (a thread that
// tests against one that owns blocking calls) are bench/bench_comm_overlap.cpp's.
#pragma once
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace relay {

class ProgressThread {
 public:
  using Done = std::shared_ptr<std::atomic<bool>>;
  // poll_us: the pause between two rounds of tests while requests are pending (a spinning thread would take the
  // core from the rank's compute on a machine whose ranks share cores). While the rank computes and rounds finish
  // nothing, the pause doubles up to max_poll_us, back to poll_us once a request completes or a new one comes: a
  // long collective over TCP needs a test only about every millisecond (the socket buffers hold more than that),
  // and each wake-up costs CPU (bench/bench_comm_cpu_shaped.sh: 50 us polls for a whole all-reduce cost ~25% more
  // CPU per GB than 1000 us ones; bench/RESULTS.md).
  // lane_depth: how many of the lane's collectives (enqueue) travel at once.
  explicit ProgressThread(int poll_us = 50, int max_poll_us = 1000, int lane_depth = 3);
  // Stops the thread (requests still pending are left to MPI: the job is ending); never waits on a peer.
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Takes req (started by the caller, which must not test or wait on it again); the flag turns true once it is done.
  Done adopt(MPI_Request req);
  // The lane: collectives this thread starts itself in the order they were queued, at most lane_depth travelling at
  // once, the next started when one finishes (start posts it and returns its request; the flag turns true once it is
  // done). ZeRO-1/2's parameter all-gathers, all started together after the update, shared the link and each arrived
  // only when nearly all had, the next forward's first bucket among them. One at a time, a single all-gather
  // moved ~0.07 GB/s over the 1 Gbit/s (0.125 GB/s) shaped link (Open MPI's TCP pipeline of one message); three at a
  // time gave the shortest steps (dp 2 ZeRO-1, 5-step runs: depth 1 7.29-7.42 s, 2 6.97-7.30, 3 6.76-6.99, 4 6.82-7.18,
  // 6 6.96-7.11, all 13 at once 7.65-7.80; bench/RESULTS.md). Every rank must queue the same collectives in the same
  // order, on a communicator nothing else starts collectives on.
  Done enqueue(std::function<MPI_Request()> start);
  // The rank's thread waits on one of them (between the two calls): test without pausing for the first 2 ms, as a
  // blocking MPI wait would (the rank's core is free then), then every poll interval (ranks may share cores).
  void waiting(bool on) { waiters_.fetch_add(on ? 1 : -1, std::memory_order_relaxed); }
  // Whether this MPI library lets a second thread make MPI calls (MPI_Init_thread gave MPI_THREAD_MULTIPLE).
  static bool supported();

 private:
  void run();
  int poll_us_;
  int max_poll_us_;
  size_t lane_depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> waiters_{0};
  std::vector<MPI_Request> incoming_;  // handed over, not yet taken by the thread
  std::vector<Done> incoming_done_;
  std::deque<std::pair<std::function<MPI_Request()>, Done>> lane_;  // queued, not yet started
  std::thread thread_;
};

// The job's progress thread, installed by `relay train` for the length of a run with parallel.overlap = true (null:
// requests advance only inside the rank's own MPI calls, today's order).
void set_active_progress(ProgressThread* p);
ProgressThread* active_progress();

}  // namespace relay
