#include "backend/op_profile_table.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace relay {

namespace {
std::string fixed_decimals(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
}  // namespace

std::string op_profile_table(const char* what, const std::string& device, const char* busy, const char* gaps,
                             double long_gap_ms, const OpProfileTotals& t) {
  std::string out = cat("relay: ", what, " by op (RELAY_OP_PROFILE) on ", device, ": ", t.count, " ops, ",
                        fixed_decimals(t.busy_ms, 1), " ", busy, "; ", gaps, " ", fixed_decimals(t.short_gaps_ms, 1),
                        " ms (each < ", long_gap_ms, " ms) + ", fixed_decimals(t.long_gaps_ms, 1),
                        " ms (longer: evaluation, checkpoints), from the second training step on\n");
  std::vector<std::pair<std::string, OpTotal>> rows(t.ops.begin(), t.ops.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  for (const auto& [op, o] : rows)
    out += cat("  ", fixed_decimals(o.ms, 2), " ms ", fixed_decimals(100.0 * o.ms / std::max(t.busy_ms, 1e-9), 1),
               "% ", o.count, " x ", op, "\n");
  return out;
}

}  // namespace relay
