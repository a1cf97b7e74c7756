#include "backend/cpu_op_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/error.hpp"

namespace relay {
namespace {
struct Open {
  const char* op = nullptr;
  std::chrono::steady_clock::time_point start;
  int depth = 0;  // nesting of front-door ops on this thread: only the outermost is timed
};
thread_local Open open_op;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
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
    (gap < kLongGapMs ? short_gaps_ms_ : long_gaps_ms_) += gap;
  }
}

void CpuOpProfile::end() {
  if (--open_op.depth > 0) return;
  const Clock::time_point now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - open_op.start).count();
  std::lock_guard<std::mutex> lock(m_);
  Total& t = totals_[open_op.op];
  t.ms += ms;
  ++t.count;
  ++ops_;
  if (std::this_thread::get_id() != step_thread_) return;
  busy_ms_ += ms;
  last_end_ = now;
  has_last_ = true;
}

void CpuOpProfile::restart() {
  std::lock_guard<std::mutex> lock(m_);
  totals_.clear();
  busy_ms_ = short_gaps_ms_ = long_gaps_ms_ = 0;
  ops_ = 0;
  has_last_ = false;
  step_thread_ = std::this_thread::get_id();
}

void CpuOpProfile::print(const std::string& backend) const {
  std::lock_guard<std::mutex> lock(m_);
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::string out = cat("relay: CPU wall time by op (RELAY_OP_PROFILE) on ", backend, ": ", ops_, " ops, ",
                        fixed(busy_ms_, 1), " ms in ops; between ops ", fixed(short_gaps_ms_, 1), " ms (each < ",
                        kLongGapMs, " ms) + ", fixed(long_gaps_ms_, 1),
                        " ms (longer: evaluation, checkpoints), from the second training step on\n");
  for (const auto& [op, t] : rows)
    out += cat("  ", fixed(t.ms, 2), " ms ", fixed(100.0 * t.ms / std::max(busy_ms_, 1e-9), 1), "% ", t.count, " x ",
               op, "\n");
  std::fputs(out.c_str(), stderr);
}

}  // namespace relay
