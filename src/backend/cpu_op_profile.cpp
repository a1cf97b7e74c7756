#include "backend/cpu_op_profile.hpp"

#include <cstdio>
#include <thread>

#include "backend/op_profile_table.hpp"
#include "core/error.hpp"

namespace relay {
namespace {
struct Open {
  const char* op = nullptr;
  std::chrono::steady_clock::time_point start;
  int depth = 0;  // nesting of front-door ops on this thread: only the outermost is timed
};
thread_local Open open_op;
}  // namespace

void CpuOpProfile::begin(const char* op) {
  if (open_op.depth++ > 0) return;
  open_op.op = op;
  open_op.start = Clock::now();
  std::lock_guard<std::mutex> lock(m_);
  if (step_thread_ == std::thread::id()) step_thread_ = std::this_thread::get_id();
  if (std::this_thread::get_id() != step_thread_) return;
  if (has_last_) {
    const double gap = std::chrono::duration<double, std::milli>(open_op.start - last_end_).count();
    (gap < kLongGapMs ? t_.short_gaps_ms : t_.long_gaps_ms) += gap;
  }
}

void CpuOpProfile::end() {
  if (--open_op.depth > 0) return;
  const Clock::time_point now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - open_op.start).count();
  std::lock_guard<std::mutex> lock(m_);
  OpTotal& o = t_.ops[open_op.op];
  o.ms += ms;
  ++o.count;
  ++t_.count;
  if (std::this_thread::get_id() != step_thread_) return;
  t_.busy_ms += ms;
  last_end_ = now;
  has_last_ = true;
}

void CpuOpProfile::restart() {
  std::lock_guard<std::mutex> lock(m_);
  t_ = OpProfileTotals();
  has_last_ = false;
  step_thread_ = std::this_thread::get_id();
}

void CpuOpProfile::print(const std::string& backend) const {
  std::lock_guard<std::mutex> lock(m_);
  std::fputs(op_profile_table("CPU wall time", backend, "ms in ops", "between ops", kLongGapMs, t_).c_str(), stderr);
}

}  // namespace relay
