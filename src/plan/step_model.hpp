// One layout's predicted training step on a cluster: per-chunk forward / backward-input / backward-weight
// costs (plan/cost_model.hpp) fed to the schedule simulator (parallel/simulator.hpp) with the pipeline
// sends as its comm cost, then the data-parallel collectives as Relay overlaps them (parallel/
// data_parallel.hpp; parallel.overlap's per-bucket reductions and deferred ZeRO-1/2 gathers, or without it each
// chunk's reductions after its backward and the gathers after the optimizer), the optimizer, and the memory of the largest rank from the memory plan
// (train/memory_plan.hpp). Nothing is allocated: a 405B model is planned as a 1M one.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "plan/cluster.hpp"
#include "plan/cost_model.hpp"
#include "plan/layout_cache.hpp"

namespace relay {

struct StepPrediction {
  double step_time_s = 0;
  double tokens_per_s_per_device = 0;
  double mfu = 0;                         // model_flops_per_row (model/block_cost.hpp) x tokens / (time x devices x peak)
  double hardware_flops_per_s_per_device = 0;  // recomputation counted
  double memory_bytes_per_device = 0;     // the largest rank's planned bytes (what Relay allocates)
  std::vector<double> stage_memory_bytes;  // (pp) each pipeline rank's planned bytes, tp rank 0
  bool fits = false;                      // memory + the device's reserved bytes <= its memory
  double bubble_fraction = 0;             // the simulator's idle share of the pipeline ranks
  double exposed_comm_s = 0;              // communication the step waits for (see step_model.cpp)
  double compute_s = 0;                   // the busiest rank's compute, collectives inside blocks excluded
  double tp_cp_comm_s = 0, dp_comm_exposed_s = 0, pipeline_comm_s = 0, optimizer_s = 0;
  double ep_comm_s = 0;                   // of tp_cp_comm_s: the expert-parallel all-to-alls (what stays exposed)
  // parallel.overlap: seconds of cp's key/value all-gathers hidden behind the own rows' attention, and of ep's
  // all-to-alls hidden behind the other part's experts (not in tp_cp_comm_s, which holds what stays exposed of them)
  double cp_hidden_s = 0, ep_hidden_s = 0;
  // parallel.overlap: seconds of tp's input-gradient all-reduces (under sequence parallelism their reduce-scatters)
  // hidden behind the column-parallel weight gradients, and of sp's forward all-gathers behind the collective
  // matmul's GEMMs (not in tp_cp_comm_s either)
  double tp_hidden_s = 0;
  double checkpoint_bytes = 0;            // rank 0's whole checkpoint image
  int devices = 0;
};

// The prediction for cfg's layout (parallel.*, train.*, optimizer.zero, model.*) on `cluster`. Throws Error
// (naming the key) for a layout Relay cannot run. With time_only_if_fits, a layout whose memory does not fit
// gets its memory only (the search's shortcut). kernels: the attention and elementwise kernels priced
// (plan/cost_model.hpp; Relay's own by default, another only to compare with published runs that used them).
StepPrediction predict_step(const Cluster& cluster, const Config& cfg, bool time_only_if_fits = false,
                            PlannedKernels kernels = {});
// The same from facts already built for cfg's layout shape (plan/layout_cache.hpp: the search's, shared by the layouts
// of one shape): the same prediction, bit for bit, as building them here.
StepPrediction predict_step(const Cluster& cluster, const Config& cfg, const LayoutFacts& facts,
                            bool time_only_if_fits = false, PlannedKernels kernels = {});
// ... and the schedule's lists and slots from `schedules` (the search's, shared by the layouts of one schedule shape).
StepPrediction predict_step(const Cluster& cluster, const Config& cfg, const LayoutFacts& facts,
                            ScheduleCache& schedules, bool time_only_if_fits = false,
                            PlannedKernels kernels = {});

// One block's ZeRO-2/3 moves on one stage (pp 1), per micro-batch: its compute, its parameters' gather before its
// forward and before its backward, its buckets' reduce-scatter after its backward; hooks: the block has parameters
// (ModelChunk calls the hooks of those blocks only).
struct BlockMoves {
  double forward, backward, gather_f, gather_b, reduce_scatter;
  bool hooks;
};
struct ZeroWaits {
  double forward = 0, backward = 0;                // seconds the blocks wait on the moves, per micro-batch
  double drain = 0;                                // then waiting for the reduce-scatters still in flight (once a step)
  double hidden_forward = 0, hidden_backward = 0;  // seconds of the moves that ran behind the compute
};

// The moves timed as Relay issues them (parallel/data_parallel.cpp, model/chunk.cpp), one link carrying them one after
// another in the order issued: a block's gather is waited for before it runs and the next block's started then (one
// block ahead); after a block's backward its buckets' reduce-scatter starts, and once more than Zero2Pool::kInFlight
// are in flight the oldest is waited for; the last ones are waited for at the end (drain: Relay waits for the last
// micro-batch's before the optimizer, an earlier one's behind the next micro-batch, taken as hidden there). The
// per-block sum this replaced (a block's gather hidden behind the block before, its reduce-scatter behind its own
// backward, each up to that block's compute) missed the chain: a gather issued late delays the next one behind it on
// the link, and the last blocks' reduce-scatters start only as the backward ends. It predicted 0.42 s a step exposed
// for dp 2 ZeRO-3 on a shaped link that measured 2.2 (bench/RESULTS.md).
ZeroWaits zero_block_waits(const std::vector<BlockMoves>& blocks);

// "dp 24, tp 8, pp 8 (1f1b), mbs 1 x 96, ZeRO-1, recompute": the layout's keys in one line (", ep 8" after tp / cp
// under expert parallelism).
std::string describe_layout(const Config& cfg);

}  // namespace relay
