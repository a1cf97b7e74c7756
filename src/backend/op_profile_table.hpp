// The table RELAY_OP_PROFILE prints on either backend (cpu_op_profile.hpp times ops by the wall clock,
// cuda_backend.cpp's OpProfile by CUDA events): one row an op, slowest first.
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace relay {

struct OpTotal {
  double ms = 0;
  int64_t count = 0;
};

// What a backend's profile measured since its restart: ops and their time, and the time between them (gaps below
// long_gap_ms apart from the longer ones: evaluation, checkpoints).
struct OpProfileTotals {
  std::map<std::string, OpTotal> ops;
  int64_t count = 0;
  double busy_ms = 0, short_gaps_ms = 0, long_gaps_ms = 0;
};
// "relay: <what> by op (RELAY_OP_PROFILE) on <device>: <count> ops, <busy_ms> <busy>; <gaps> ..." then one row an
// op, "  <ms> ms <share of busy_ms>% <count> x <op>", the largest ms first.
std::string op_profile_table(const char* what, const std::string& device, const char* busy, const char* gaps,
                             double long_gap_ms, const OpProfileTotals& t);

}  // namespace relay
