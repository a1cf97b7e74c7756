// Memory per rank, predicted from the config before anything runs (`relay plan`) and measured from
// the tensors a run holds (core/memory.hpp), by kind: parameters (fp32, this rank's tp shard of every
// parameter its stage holds), gradients (the buckets, plus the reduce-scatter output under ZeRO-1),
// optimizer state (AdamW's two moments or SGD's momentum, 1/dp of them under ZeRO-1) and activations
// (every micro-batch slot of every chunk on the rank: block inputs and outputs, their gradients, the
// blocks' saved intermediates, the loss's buffers; with train.recompute = "blocks" a transformer block
// keeps its input only, plus one scratch set per chunk). Eval buffers and ZeRO's bucket padding (under
// dp elements per bucket) are not in the prediction. Under ZeRO-2 the gradients are every bucket's shard
// (padded) and the pool of in-flight bucket buffers (parallel/data_parallel.hpp), which are exact.
#pragma once
#include <cstdint>
#include <string>

#include "core/config.hpp"
#include "core/memory.hpp"  // mib()
#include "parallel/data_parallel.hpp"  // BucketCaps
#include "parallel/slot_plan.hpp"
#include "train/model_layout.hpp"

namespace relay {

struct MemoryBytes {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t gathered = 0;  // ZeRO-3: parameters gathered at once at their most, beyond params (not in total())
  int64_t step_grads = 0;  // ZeRO-3 under pp > 1: the step's whole gradient buckets, freed after its reduce-scatter
                           // (not in total())
  int64_t total() const { return params + grads + optimizer + activations; }
};

// The gradient buckets' size limit: parallel.bucket_mb, or under ZeRO-3 0 (a bucket per block: the gather unit).
// The first bucket of each run: parallel.first_bucket_mb (ZeRO-3: a block too).
inline BucketCaps zero_bucket_caps(const Config& cfg) {
  if (cfg.optimizer.zero >= 3) return {0.0};
  return {cfg.parallel.bucket_mb, cfg.parallel.first_bucket_mb};
}

// ZeRO-2's gradient buckets on the rank at (pp_rank, tp_rank) with dp replicas: their padded sizes and the pool. Under
// parallel.ep an expert's buckets are sharded over its dp / ep copies, or kept whole where it has none.
struct ZeroTwoBuckets {
  int64_t total_padded = 0;  // every bucket, padded to a multiple of the ranks sharding it
  int64_t shards = 0;        // this rank's piece of every sharded bucket (padded / its ranks)
  int64_t whole = 0;         // the buckets with no other copy (kept whole: not sharded, pooled or gathered)
  int64_t pool_buffers = 0, pool_elements = 0;  // the in-flight buffers a step allocates (Zero2Pool)
  int64_t pool_piece_elements = 0;              // their pieces of the sums
  int64_t launches = 0, launched_elements = 0;  // a step's reduce-scatters and their summed sizes
  // ZeRO-3: the most parameter bytes gathered at once, and the bytes all-gathered a step: the working dtype's, and
  // under parallel.fp8_param_gather the FP8 linear weights' buckets at one byte an element (their e4m3 codes).
  int64_t gathered_peak_bytes = 0;
  int64_t gathered_bytes = 0;
  bool kept = false;              // ZeRO-3: gathered parameters kept to the end of the step (pp > 1, or no reshard)
};
ZeroTwoBuckets zero2_buckets(const Config& cfg, const ModelLayout& layout, int pp_rank, int tp_rank, int dp);

// The parameter elements the rank at (pp_rank, tp_rank) holds: its tp shard of every parameter of its chunks, once; of
// a MoE layer's experts under parallel.ep only its own (every ep rank holds as many). expert: those of experts.
struct StageParams {
  int64_t numel = 0, expert = 0;
  // train.precision = "fp8": the FP8 linear and expert weights' cached codes and scales (model/param.hpp's
  // Fp8WeightCache; ParamSpec::fp8_cached), bytes (one an element, four a scale); ZeRO-3 keeps none.
  int64_t fp8_cache_bytes = 0;
};
StageParams stage_params(const ModelLayout& layout, int pp_rank, int tp, int tp_rank);

// What the memory plan of the rank at (pp_rank, tp_rank) reads from the layout alone (tp, cp, ep, pp and v): its
// parameters and, for ZeRO-2/3, its gradient bucket keys in first-use order with the blocks that write each. Built by
// walking thousands of named parameters (45,000 for DeepSeek-V3), so `relay plan --cluster`'s search builds it once per
// layout shape (plan/layout_cache.hpp) and reuses it across ZeRO stages, micro-batchings and schedules.
struct StageKeys {
  StageParams params;
  bool has_bucket_keys = false;       // keys and writers filled (with_bucket_keys)
  std::vector<BucketKey> keys;        // (stage parameters) as the trainer hands them to GradBuckets
  std::vector<std::vector<int>> writers;  // (stage parameters) the blocks that write each key's gradient
};
StageKeys stage_keys(const ModelLayout& layout, int pp_rank, int tp, int tp_rank, bool with_bucket_keys);
// stage_keys(layout, p, tp, tp_rank, true) of every pipeline rank p, the model's parameters placed once for all.
std::vector<StageKeys> all_stage_keys(const ModelLayout& layout, int tp, int tp_rank);
// actions: the rank's list of cfg's schedule when the caller holds it (generate_schedule's otherwise).
ZeroTwoBuckets zero2_buckets(const Config& cfg, const ModelLayout& layout, const StageKeys& stage, int pp_rank, int dp,
                             const std::vector<Action>* actions = nullptr);

// The rank at (pp_rank, tp_rank) of the config's layout (every replica holds the same); with `stage` (stage_keys of
// the same layout, rank and tp, bucket keys included) instead of walking the parameters again, and `schedule`
// (plan_schedule of cfg's schedule shape) instead of generating and replaying the rank's list: the same bytes.
MemoryBytes predict_memory(const Config& cfg, const ModelLayout& layout, int pp_rank, int tp_rank);
MemoryBytes predict_memory(const Config& cfg, const ModelLayout& layout, const StageKeys& stage, int pp_rank,
                           int tp_rank, const PlannedSchedule* schedule = nullptr);
// The memory term of the pipeline partition (parallel/partition.hpp) for cfg's layout, tp rank 0, with budget
// parallel.stage_memory_gib: a stage's bytes by predict_memory's rules for a chunk of those blocks (its parameters once,
// the ZeRO stage's shares of gradients and optimizer state, the chunk's planned slot, boundary and scratch buffers, the
// loss's on the last), but not ZeRO-2's bucket pool, ZeRO-3's gathered blocks, cp's or sp's shared buffers, which the
// memory plan adds on the chosen stages. Off (budget 0) without the key, under pp 1 or virtual stages.
// The parameter elements of each block on tp rank 0 (ep rank 0's experts), dense and experts', and the parameters
// several blocks use (a tied embedding): what stage_memory reads of the model, built once per layout shape.
struct BlockElements {
  std::vector<double> dense, expert;  // (blocks)
  struct Shared {
    double elements = 0;
    bool expert = false;
    std::vector<int> users;  // the blocks using it
  };
  std::vector<Shared> shared;
};
BlockElements block_elements(const ModelSpec& model, int tp, int ep);
// slots: stage_slots(cfg), when the caller holds them (the search's layouts of one schedule shape share them).
StageMemory stage_memory(const Config& cfg, const ModelSpec& model, const BlockElements* elements = nullptr,
                         const std::vector<double>* slots = nullptr);
// (pp) the micro-batches in flight on each pipeline rank's chunk under cfg's schedule (one chunk a rank).
std::vector<double> stage_slots(const Config& cfg);

// What this process's tensors hold now.
MemoryBytes measured_memory();

}  // namespace relay
