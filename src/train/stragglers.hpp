// Stragglers: every rank's compute time per step, gathered on rank 0 at each log step (one gather of
// two doubles per rank, cheap enough to be always on). Rank 0 logs the slowest rank and the median,
// warns when one rank stays slower than its peers, and prints a per-rank table at the end.
// After Megatron-LM's straggler detector (megatron/core/utils.py, StragglerDetector), which reports
// the slowest and the median rank's timings every logging interval.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/process_grid.hpp"

namespace relay {

// One logging window's compute per step over all ranks (rank 0); slowest_rank -1 with one rank.
struct WindowTimes {
  int slowest_rank = -1;
  double slowest_compute_s = 0, median_compute_s = 0;
};

class StragglerMonitor {
 public:
  // A rank is a straggler when its compute per step exceeds its peers' median by more than kMargin
  // and by more than kMinExcessS (timer and scheduler noise on tiny models) in kWindows logging
  // windows in a row. Its peers: the other ranks of its pipeline stage (they do the same work); with
  // one rank per stage, every other rank.
  static constexpr double kMargin = 0.20;
  static constexpr double kMinExcessS = 0.001;
  static constexpr int kWindows = 3;

  StragglerMonitor(const ProcessGrid& grid, Communicator& world);
  // Collective, at every log step: this rank's compute and waiting time summed over the window's
  // `steps` steps, which end at `step`. Rank 0 gets the window's figures and prints any warning.
  WindowTimes window(double compute_s, double wait_s, int64_t steps, int64_t step);
  // Collective, at the end of the run: rank 0 prints every rank's compute and waiting time per step
  // over the `steps` steps this run made, and its exposed data-parallel communication (StepStats::exposed_comm_s).
  void report(double compute_s, double wait_s, double exposed_comm_s, int64_t steps);

 private:
  // Every rank's `values` (each divided by steps) on rank 0: (world, values.size()).
  std::vector<double> gather(std::vector<double> values, int64_t steps, const std::string& what);

  const ProcessGrid& grid_;
  Communicator& world_;
  std::vector<std::vector<int>> peers_;  // by world rank
  std::vector<int> streak_;              // windows in a row each rank was over the margin
};

}  // namespace relay
