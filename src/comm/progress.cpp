// The progress thread: requests handed over by the rank's thread, tested together with MPI_Testsome every poll
// interval; a completed request's flag is set (release) for the rank's thread to see (acquire).
#include "comm/progress.hpp"

#include <algorithm>
#include <chrono>

#include "comm/mpi_check.hpp"

namespace relay {

namespace {
ProgressThread* g_active = nullptr;
}

ProgressThread::ProgressThread(int poll_us, int max_poll_us, int lane_depth)
    : poll_us_(poll_us),
      max_poll_us_(std::max(poll_us, max_poll_us)),
      lane_depth_(static_cast<size_t>(std::max(1, lane_depth))),
      thread_([this] { run(); }) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
  if (g_active == this) g_active = nullptr;
}

bool ProgressThread::supported() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

ProgressThread::Done ProgressThread::adopt(MPI_Request req) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(req);
    incoming_done_.push_back(done);
  }
  cv_.notify_one();
  return done;
}

ProgressThread::Done ProgressThread::enqueue(std::function<MPI_Request()> start) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    lane_.emplace_back(std::move(start), done);
  }
  cv_.notify_one();
  return done;
}

void ProgressThread::run() {
  std::vector<MPI_Request> pending;  // the requests this thread owns, in the order they were handed over
  std::vector<Done> flags;           // each one's completion flag
  std::vector<int> finished;
  std::chrono::steady_clock::time_point spin_from{};  // when the current unpaused testing for a waiter began
  int pause_us = poll_us_;  // the pause while the rank computes: doubles each fruitless round up to max_poll_us_
  std::vector<Done> lane_flight;  // the lane's collectives started and not yet done
  for (;;) {
    std::vector<std::pair<std::function<MPI_Request()>, Done>> starts;  // the lane's to start now
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle (nothing pending): sleep until a request comes, so the thread costs nothing between steps.
      if (pending.empty()) cv_.wait(lock, [this] { return stop_ || !incoming_.empty() || !lane_.empty(); });
      if (stop_) return;
      if (!incoming_.empty()) pause_us = poll_us_;  // a new request: its first rounds may be quick
      pending.insert(pending.end(), incoming_.begin(), incoming_.end());
      flags.insert(flags.end(), incoming_done_.begin(), incoming_done_.end());
      incoming_.clear();
      incoming_done_.clear();
      lane_flight.erase(std::remove_if(lane_flight.begin(), lane_flight.end(),
                                       [](const Done& d) { return d->load(std::memory_order_relaxed); }),
                        lane_flight.end());
      while (lane_flight.size() + starts.size() < lane_depth_ && !lane_.empty()) {
        starts.push_back(std::move(lane_.front()));
        lane_.pop_front();
      }
    }
    for (auto& [start, flag] : starts) {  // posted outside the lock (an MPI call may take a while)
      pending.push_back(start());
      flags.push_back(flag);
      lane_flight.push_back(std::move(flag));
      pause_us = poll_us_;
    }
    finished.resize(pending.size());
    int count = 0;
    MPI_CHECK(MPI_Testsome(static_cast<int>(pending.size()), pending.data(), &count, finished.data(),
                           MPI_STATUSES_IGNORE));
    if (count > 0 && count != MPI_UNDEFINED) {
      for (int i = 0; i < count; ++i)
        flags[static_cast<size_t>(finished[static_cast<size_t>(i)])]->store(true, std::memory_order_release);
      size_t keep = 0;  // drop the completed (MPI set them to MPI_REQUEST_NULL), keeping the order
      for (size_t i = 0; i < pending.size(); ++i)
        if (pending[i] != MPI_REQUEST_NULL) {
          if (keep != i) {
            pending[keep] = pending[i];
            flags[keep] = std::move(flags[i]);
          }
          ++keep;
        }
      pending.resize(keep);
      flags.resize(keep);
      spin_from = {};
      pause_us = poll_us_;
      continue;  // something finished: the next may be close behind
    }
    // The rank waits on one of these: test without pausing for 2 ms (its core is free then), after that every
    // poll interval as the watchdog's own wait does, so that ranks sharing cores (more ranks than cores, a
    // rank writing a checkpoint while the others wait on it) are not starved by spinning threads.
    const auto now = std::chrono::steady_clock::now();
    if (waiters_.load(std::memory_order_relaxed) == 0) {
      spin_from = {};
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
      pause_us = std::min(2 * pause_us, max_poll_us_);
    } else {
      if (spin_from == std::chrono::steady_clock::time_point{}) spin_from = now;
      if (now - spin_from < std::chrono::milliseconds(2)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(poll_us_));
    }
  }
}

void set_active_progress(ProgressThread* p) { g_active = p; }
ProgressThread* active_progress() { return g_active; }

}  // namespace relay
