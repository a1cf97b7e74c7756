// The progress watchdog: polled MPI waits with a deadline, and a question-and-answer round over a
// communicator of its own to tell a stalled rank (silent) from a slow one (answers "working").
#include "comm/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"

namespace relay {

namespace {

constexpr int kQueryTag = 901, kReplyTag = 902;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Watchdog* g_active = nullptr;

// How long the waiters give the others to answer: long enough for a rank in the middle of one
// schedule action or checkpoint tensor to reach its next poll point, short next to the timeout.
double grace_for(double timeout) { return std::clamp(timeout / 20.0, 2.0, 10.0); }

}  // namespace

Watchdog::Watchdog(MPI_Comm world, double timeout_s, std::function<std::string(int)> describe)
    : timeout_(timeout_s), describe_(std::move(describe)), last_progress_(now_s()) {
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

Watchdog::~Watchdog() {
  if (g_active == this) g_active = nullptr;
  for (auto& p : sends_) MPI_Request_free(&p.req);  // answers nobody will read any more
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

double Watchdog::seconds_since_progress() const { return now_s() - last_progress_.load(); }

void Watchdog::progress() {
  last_progress_ = now_s();
  if (timeout_ > 0) service();
}

void Watchdog::answer(int to, int round, bool waiting, const std::string& what) {
  Reply r;
  r.rank = rank_;
  r.working = waiting ? 0 : 1;
  r.idle_s = now_s() - last_progress_.load();
  std::snprintf(r.what, sizeof r.what, "%s", what.c_str());
  Pending p;
  p.buf.resize(sizeof(int) + sizeof r);
  std::memcpy(p.buf.data(), &round, sizeof(int));
  std::memcpy(p.buf.data() + sizeof(int), &r, sizeof r);
  sends_.push_back(std::move(p));
  MPI_CHECK(MPI_Isend(sends_.back().buf.data(), static_cast<int>(sends_.back().buf.size()), MPI_BYTE, to, kReplyTag,
                      comm_, &sends_.back().req));
}

void Watchdog::service() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, comm_, &flag, &st));
    if (!flag) break;
    int q[2];
    MPI_CHECK(MPI_Recv(q, 2, MPI_INT, st.MPI_SOURCE, kQueryTag, comm_, MPI_STATUS_IGNORE));
    answer(st.MPI_SOURCE, q[0], waiting_, waiting_ ? waiting_for_ : context_);
  }
  while (!sends_.empty()) {
    int done = 0;
    MPI_CHECK(MPI_Test(&sends_.front().req, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    sends_.pop_front();
  }
}

namespace {
// Polls done() until it holds: a short spin for latency, then sleeps that yield the core.
void poll_until(const std::function<bool()>& done) {
  const double t0 = now_s();
  while (!done())
    if (now_s() - t0 > 0.002) std::this_thread::sleep_for(std::chrono::microseconds(100));
}
}  // namespace

void Watchdog::wait(MPI_Request* req, const std::string& what, int peer) {
  if (timeout_ <= 0) {
    MPI_CHECK(MPI_Wait(req, MPI_STATUS_IGNORE));
    return;
  }
  wait_until(
      [req] {
        int done = 0;
        MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      what, peer);
}

void Watchdog::wait_until(const std::function<bool()>& test, const std::string& what, int peer) {
  if (timeout_ <= 0) {
    poll_until(test);
    return;
  }
  waiting_ = true;
  waiting_for_ = context_.empty() ? what : what + " at " + context_;
  double start = now_s();
  const double t0 = start;
  for (int spin = 0;; ++spin) {
    if (test()) break;
    service();
    const double t = now_s();
    if (t - start >= timeout_) {
      // Ask everyone else what they are doing; keep polling our request meanwhile.
      const int round = ++round_;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        Pending p;
        p.buf.resize(2 * sizeof(int));
        const int q[2] = {round, rank_};
        std::memcpy(p.buf.data(), q, sizeof q);
        sends_.push_back(std::move(p));
        MPI_CHECK(MPI_Isend(sends_.back().buf.data(), 2, MPI_INT, r, kQueryTag, comm_, &sends_.back().req));
      }
      std::vector<Reply> replies;
      std::vector<char> replied(static_cast<size_t>(size_), 0);
      replied[static_cast<size_t>(rank_)] = 1;
      const double until = now_s() + grace_for(timeout_);
      bool completed = false;
      while (now_s() < until && static_cast<int>(replies.size()) < size_ - 1) {
        if (test()) {
          completed = true;
          break;
        }
        service();
        int flag = 0;
        MPI_Status st;
        MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, comm_, &flag, &st));
        if (flag) {
          std::vector<char> buf(sizeof(int) + sizeof(Reply));
          MPI_CHECK(MPI_Recv(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, st.MPI_SOURCE, kReplyTag, comm_,
                             MPI_STATUS_IGNORE));
          int r_round = 0;
          Reply r;
          std::memcpy(&r_round, buf.data(), sizeof(int));
          std::memcpy(&r, buf.data() + sizeof(int), sizeof r);
          if (r_round == round && !replied[static_cast<size_t>(r.rank)]) {  // answers to old rounds are stale
            replied[static_cast<size_t>(r.rank)] = 1;
            replies.push_back(r);
          }
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (completed) break;
      std::vector<int> silent;
      for (int r = 0; r < size_; ++r)
        if (!replied[static_cast<size_t>(r)]) silent.push_back(r);
      // Working, or waiting but with progress within the timeout (rank 0 streaming a checkpoint answers from
      // its receive of the next tensor while the senders of later ones wait on it): slow, not stalled. A deadlock
      // leaves every rank idle; one that entered its wait lately is seen idle at the next round.
      const bool someone_working = std::any_of(replies.begin(), replies.end(), [&](const Reply& r) {
        return r.working != 0 || r.idle_s < timeout_;
      });
      if (silent.empty() && someone_working) {
        start = now_s();  // slow, not stalled: wait another timeout
        continue;
      }
      end_job(silent, replies, now_s() - t0, waiting_for_, peer);
    }
    // Spin briefly for latency, then yield the core (ranks may share cores).
    if (t - start > 0.002) std::this_thread::sleep_for(std::chrono::microseconds(100));
    (void)spin;
  }
  waiting_ = false;
  last_progress_ = now_s();  // a completed wait is progress
}

void Watchdog::end_job(const std::vector<int>& silent, const std::vector<Reply>& replies, double waited,
                       const std::string& what, int peer) {
  // Every waiting rank reaches this; the lowest of them prints the one line, then ends the job.
  int printer = rank_;
  for (const Reply& r : replies)
    if (!r.working) printer = std::min(printer, r.rank);
  std::string msg;
  if (!silent.empty()) {
    std::string who;
    for (size_t i = 0; i < silent.size() && i < 4; ++i) who += cat(i ? ", " : "", describe_(silent[i]));
    if (silent.size() > 4) who += cat(" and ", silent.size() - 4, " more");
    msg = cat(who, " made no progress for ", static_cast<long long>(waited), " s while rank ", rank_, " waited for ",
              what, peer >= 0 && std::find(silent.begin(), silent.end(), peer) == silent.end()
                        ? cat(" from ", describe_(peer))
                        : std::string(),
              " (parallel.timeout = ", timeout_, " s; hint: a stopped, swapping or wedged process, or a dead link)");
  } else {
    msg = cat("every rank is waiting and none makes progress (a deadlock) after ", static_cast<long long>(waited),
              " s: rank ", rank_, " waits for ", what);
    for (const Reply& r : replies) msg += cat("; rank ", r.rank, " waits for ", r.what);
  }
  // A silent rank is the machine's fault (kExitStalled: the job scripts restart the run); a deadlock
  // is Relay's own and would repeat (kExitError).
  const int code = silent.empty() ? kExitError : kExitStalled;
  if (printer == rank_) {
    print_error(msg);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  // Another waiting rank prints and aborts; give it time, then end the job anyway.
  const double until = now_s() + 2 * grace_for(timeout_);
  while (now_s() < until) {
    service();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  print_error(msg);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();
}

void set_active_watchdog(Watchdog* w) { g_active = w; }
Watchdog* active_watchdog() { return g_active; }

void watchdog_wait(MPI_Request* req, const std::string& what, int peer) {
  if (g_active) g_active->wait(req, what, peer);
  else MPI_CHECK(MPI_Wait(req, MPI_STATUS_IGNORE));
}

void watchdog_wait_until(const std::function<bool()>& done, const std::string& what, int peer) {
  if (g_active) g_active->wait_until(done, what, peer);
  else poll_until(done);
}

void watchdog_progress() {
  if (g_active) g_active->progress();
}

}  // namespace relay
