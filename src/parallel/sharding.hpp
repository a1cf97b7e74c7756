// Data parallelism's sharding as data: for each ZeRO stage (Rajbhandari et al., arXiv:1910.02054; ZeRO-3 as FSDP,
// Zhao et al., arXiv:2304.11277) and each gradient group (the dense weights over the dp x cp replicas, the experts'
// over their copies), what a rank shards and what it moves: the collective, the buffer's bytes, the group of ranks,
// when the step issues it and what waits for it. FSDP2's fully_shard says the same in one call; here one pure
// function says it, GradBuckets (data_parallel.hpp) follows it, and the memory plan, the step model and `relay plan`
// read it.
#pragma once
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/tensor.hpp"

namespace relay {

// The gradient groups: every dense weight is summed over the replicas; under parallel.ep an expert's weights over
// the ranks holding the same experts only (replicas / ep of them, one in each ep group).
enum class GradGroup { dense, expert };
enum class Collective { all_reduce, reduce_scatter, all_gather };
enum class Moved { gradients, parameters };

// When the step issues a move (the schedule's actions, parallel/schedule.hpp; the chunk's block hooks,
// model/chunk.hpp).
enum class Issued {
  bucket_done,      // as each bucket's last writer finishes in the backward, every micro-batch (ZeRO-2's pool)
  allreduce_grads,  // at the chunk's allreduce_grads, after its last micro-batch's backward
  after_optimizer,  // after the optimizer step
  block_run,        // before each block's forward and again before its backward, every micro-batch (the next block's
                    // prefetched); freed after each
  block_first_run,  // before a block's first forward of the step (the next block's prefetched); kept to the step's end
};
// What waits for a move to be done.
enum class Needed {
  optimizer,     // the optimizer step (the gradients' sums)
  next_forward,  // the next step's first forward (the updated parameters)
  block_run,     // the block's run
};

// Where a group's gradients live.
enum class GradHold {
  buckets,       // whole buckets for the run (ZeRO-0; ZeRO-1 keeps its shard of their sum beside them)
  pooled,        // its shard of the sum; a bucket is whole only in a pooled buffer, from its first writer in a
                 // micro-batch's backward to its reduce-scatter (ZeRO-2; ZeRO-3 on one stage)
  step_buckets,  // its shard of the sum; every bucket whole during the step, freed after its reduce-scatter (ZeRO-3
                 // under pp > 1: no per-micro-batch collectives)
};

struct ShardingInput {
  int zero = 0;        // optimizer.zero: the ZeRO stage, 0 to 3
  int pp = 1;          // parallel.pp: pipeline stages
  int replicas = 1;    // dp x cp: the ranks holding the same dense parameters
  int ep = 1;          // parallel.ep: an expert's copies are replicas / ep ranks
  int micro_batches = 1;
  double dense_elements = 0, expert_elements = 0;  // the rank's parameter elements of each group (0: not asked)
  DType wire = DType::f32;  // parallel.grad_reduce: what gradients travel in (summed into f32 either way)
  DType work = DType::f32;  // the working dtype (train.precision): what ZeRO-3 gathers parameters in
  bool reshard_after_forward = true;  // parallel.reshard_after_forward: ZeRO-3 frees a block's gathered parameters
  // parallel.fp8_param_gather: ZeRO-3 gathers the dense weights as e4m3 codes (1 byte an element). Counted for every
  // dense element: the norms' and biases' few still travel in the working dtype (a block's norm weights are 2 C of
  // its ~12 C^2 elements).
  bool fp8_param_gather = false;
};
// cfg's stage and layout (elements 0: the caller counts them).
ShardingInput sharding_input(const Config& cfg);

struct GroupSharding {
  GradGroup group = GradGroup::dense;
  int ranks = 1;        // the ranks summing its gradients, over which ZeRO shards it; 1: no other copy, nothing moves
  int stage = 0;        // the ZeRO stage it runs at: optimizer.zero, 0 where it has no other copy
  double elements = 0;  // the rank's parameter elements of the group
  // Sharded over the ranks: this rank keeps 1 / ranks of it. parameters: the f32 masters (ZeRO-3: gathered in the
  // working dtype while a block uses them); gradients: only the shard of their sum outlives the backward (ZeRO-2, 3);
  // optimizer_state: the moments, and the updates it makes (ZeRO-1, 2, 3).
  bool parameters = false, gradients = false, optimizer_state = false;
  GradHold grads = GradHold::buckets;
  bool gathered_kept = false;  // ZeRO-3: gathered parameters kept to the end of the step (pp > 1, or no reshard)
  int shards() const { return optimizer_state ? ranks : 1; }  // the pieces a bucket is padded to and split into
};

struct Move {
  GradGroup group = GradGroup::dense;
  Moved what = Moved::gradients;
  Collective collective = Collective::all_reduce;
  DType dtype = DType::f32;  // what it travels in
  double bytes = 0;          // the group's buffer: the all-reduce's and reduce-scatter's input, the all-gather's output
  int ranks = 1;
  Issued issued = Issued::allreduce_grads;
  Needed needed = Needed::optimizer;
  int per_step = 1;  // times a step moves the buffer: 1, or per micro-batch (ZeRO-2's reduce-scatters m, ZeRO-3's
                     // gathers on one stage 2 m: forward and backward)
  // Bytes a rank sends a step in a ring: all-reduce 2 (r - 1) / r of the buffer, reduce-scatter and all-gather
  // (r - 1) / r.
  double sent() const;
};

struct Sharding {
  ShardingInput input;
  std::vector<GroupSharding> groups;  // dense, then expert (at ep 1 no weight is an expert's: 0 elements)
  std::vector<Move> moves;  // per group, in step order: ZeRO-3's gathers, the gradients' sum, the gathers after the
                            // optimizer
  const GroupSharding& group(GradGroup g) const { return groups[g == GradGroup::dense ? 0 : 1]; }
  const Move* find(GradGroup g, Moved what) const;  // the group's move of `what`, null if none
};

// A pure function of its input: the same input gives the same description on every rank and in relay plan.
Sharding describe_sharding(const ShardingInput& in);

const char* collective_name(Collective c);  // "all-reduce", "reduce-scatter", "all-gather"
const char* issued_text(Issued i);          // "after the optimizer", ...
const char* needed_text(Needed n);          // "the optimizer", ...
// What the group shards: "parameters, gradients and optimizer state", ..., "nothing".
std::string sharded_states(const GroupSharding& g);
// relay plan's lines: per group what is sharded over how many ranks, then each move with its bytes (MiB), what it
// travels in, when it is issued, what waits for it and the bytes a rank sends a step; every line starts with two
// spaces and ends with a newline.
std::string render_sharding(const Sharding& s);

}  // namespace relay
