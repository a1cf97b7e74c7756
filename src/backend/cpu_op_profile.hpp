// RELAY_OP_PROFILE on the CPU backend: each outermost op's wall time on the calling thread (steady_clock around
// the op, which on the CPU returns when its work is done), summed by op name, and the time between consecutive
// ops (the host's own work: bookkeeping, allocation, communication outside the backend), printed to stderr when
// the backend is destroyed. The CUDA backend's profile (cuda_backend.cpp) times the same ops with events and
// prints the same table, so the two read alike. Ops run from a helper thread (a communication thread's copies)
// count in the op table and never in the gaps.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "backend/op_profile_table.hpp"

namespace relay {

class CpuOpProfile {
 public:
  void begin(const char* op);
  void end();
  void restart();  // from the second training step on (step_loop.cpp)
  void print(const std::string& backend) const;

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr double kLongGapMs = 50;  // a gap this long is evaluation, a checkpoint or logging: counted apart
  mutable std::mutex m_;
  OpProfileTotals t_;  // busy_ms and the gaps: the step thread's ops only
  Clock::time_point last_end_{};  // the previous op's end on the thread that runs the step
  bool has_last_ = false;
  std::thread::id step_thread_;  // whose ops make the gaps: the first to run an op after restart()
};

}  // namespace relay
