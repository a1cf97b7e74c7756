// The layout search of `relay plan --cluster`: every layout Relay can run on the cluster's devices (dp, tp,
// pp with its schedule and virtual stages, cp, ZeRO stage, recomputation, micro-batch size and count) whose
// planned memory fits, each predicted by plan/step_model.hpp, best tokens/s first. tp stays inside a node and
// sequence parallelism is on with tp (the same bytes as the all-reduces, less memory); a pipelined layout (one chunk
// a rank) whose compute-balanced cut overfills a stage is cut again among the cuts that fit the device, compute
// balanced among them (parallel.stage_memory_gib, parallel/partition.hpp's memory term); GPipe is left out (1F1B
// has its bubble with less memory); micro-batches of 1, 2 or 4 sequences. A mixture of experts adds ep (every divisor
// of dp that divides n_experts, with every ZeRO stage), combined with tp and cp as for a dense model.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "plan/cluster.hpp"
#include "plan/step_model.hpp"

namespace relay {

struct PlannedLayout {
  Config cfg;  // the layout as the keys a training run reads
  StepPrediction prediction;
  std::string why;  // one line: why this layout (tp inside a node, pp to fit, the bubble, ...)
  // (pp) blocks per pipeline stage where the compute-balanced cut overfilled a stage and the memory term
  // (parallel.stage_memory_gib = the device's usable GiB, set in cfg) cut them to fit; empty otherwise
  std::vector<int> memory_cut;
};

struct SearchResult {
  std::vector<PlannedLayout> best;  // fitting layouts, highest tokens/s per device first (at most top)
  int64_t evaluated = 0, fitting = 0;
  // The layout needing the least memory (for the error when nothing fits) and its bytes.
  double smallest_memory_bytes = 0;
  std::string smallest_layout;
};

// The layouts of `base` (model, batch and sequence as given) on nodes x cluster.devices_per_node devices.
SearchResult search_layouts(const Cluster& cluster, const Config& base, int nodes, int top,
                            PlannedKernels kernels = {});

// Young/Daly: the checkpoint interval that minimises expected lost work, sqrt(2 x write time x the job's MTBF),
// the job's MTBF being the device MTBF over the job's devices; in steps of step_time_s (at least 1).
int64_t checkpoint_every_steps(double write_s, double device_mtbf_hours, int devices, double step_time_s);

}  // namespace relay
