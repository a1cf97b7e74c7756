#include "train/stragglers.hpp"

#include <algorithm>
#include <cstdio>

namespace relay {

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  if (v.size() % 2) return v[h];
  const double hi = v[h];
  return (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h))) / 2;
}
}  // namespace

StragglerMonitor::StragglerMonitor(const ProcessGrid& grid, Communicator& world)
    : grid_(grid), world_(world), peers_(static_cast<size_t>(grid.world_size)),
      streak_(static_cast<size_t>(grid.world_size), 0) {
  const int n = grid.world_size;
  for (int w = 0; w < n; ++w) {
    const int stage = grid_coord(w, grid.dp, grid.tp, grid.cp).pp_rank;
    for (int o = 0; o < n; ++o)
      if (o != w && (grid.dp * grid.cp * grid.tp == 1 || grid_coord(o, grid.dp, grid.tp, grid.cp).pp_rank == stage))
        peers_[static_cast<size_t>(w)].push_back(o);
  }
}

std::vector<double> StragglerMonitor::gather(std::vector<double> values, int64_t steps, const std::string& what) {
  const double n = double(std::max<int64_t>(1, steps));
  for (double& v : values) v /= n;
  const size_t k = values.size();
  std::vector<double> all(grid_.world_rank == 0 ? k * static_cast<size_t>(grid_.world_size) : 0);  // (world, k)
  world_.gather_f64(values.data(), static_cast<int>(k), all.data(), 0, what);
  return all;
}

WindowTimes StragglerMonitor::window(double compute_s, double wait_s, int64_t steps, int64_t step) {
  const std::vector<double> all = gather({compute_s, wait_s}, steps, "the per-rank timings");
  WindowTimes wt;
  const int n = grid_.world_size;
  if (grid_.world_rank != 0 || n < 2) return wt;
  std::vector<double> compute(static_cast<size_t>(n));  // (world): seconds per step
  for (int w = 0; w < n; ++w) compute[static_cast<size_t>(w)] = all[2 * static_cast<size_t>(w)];
  wt.slowest_rank = static_cast<int>(std::max_element(compute.begin(), compute.end()) - compute.begin());
  wt.slowest_compute_s = compute[static_cast<size_t>(wt.slowest_rank)];
  wt.median_compute_s = median(compute);
  for (int w = 0; w < n; ++w) {
    std::vector<double> peer;
    for (int o : peers_[static_cast<size_t>(w)]) peer.push_back(compute[static_cast<size_t>(o)]);
    const double m = median(peer), mine = compute[static_cast<size_t>(w)];
    int& streak = streak_[static_cast<size_t>(w)];
    streak = mine > (1 + kMargin) * m && mine - m > kMinExcessS ? streak + 1 : 0;
    if (streak != kWindows) continue;  // once per streak
    std::printf("relay: warning: %s is a straggler: %.2f ms of compute per step, %.2fx the median %.2f ms of "
                "%s, in %d logging windows in a row up to step %lld (margin %.0f%% and %.0f ms)\n",
                rank_label(w, grid_.dp, grid_.tp, grid_.cp).c_str(), 1e3 * mine, mine / std::max(1e-12, m), 1e3 * m,
                grid_.dp * grid_.tp > 1 ? "the other ranks of its stage" : "the other ranks", kWindows,
                static_cast<long long>(step), 100 * kMargin, 1e3 * kMinExcessS);
    std::fflush(stdout);
  }
  return wt;
}

void StragglerMonitor::report(double compute_s, double wait_s, double exposed_comm_s, int64_t steps) {
  const std::vector<double> all = gather({compute_s, wait_s, exposed_comm_s}, steps, "the per-rank timings");
  if (grid_.world_rank != 0 || steps <= 0) return;
  std::printf("relay: time per step by rank over this run's %lld steps (compute: forward and backward; waiting: "
              "pipeline receives and all-reduces; exposed comm: waits on data-, context- and tensor-parallel "
              "collectives anywhere in the step)\n  %-34s %12s %12s %7s %16s\n",
              static_cast<long long>(steps), "rank", "compute ms", "waiting ms", "idle %", "exposed comm ms");
  for (int w = 0; w < grid_.world_size; ++w) {
    const size_t i = 3 * static_cast<size_t>(w);
    const double c = all[i], t = all[i + 1], x = all[i + 2];
    std::printf("  %-34s %12.2f %12.2f %7.1f %16.2f\n", rank_label(w, grid_.dp, grid_.tp, grid_.cp).c_str(), 1e3 * c,
                1e3 * t, 100 * t / std::max(1e-12, c + t), 1e3 * x);
  }
  std::fflush(stdout);
}

}  // namespace relay
