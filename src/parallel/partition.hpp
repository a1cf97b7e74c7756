// Cuts the model's blocks into pp x v contiguous chunks (chunk c runs on pipeline rank c % pp):
// from parallel.balance (blocks per chunk), or balanced by forward FLOPs with every block that cannot
// start a stage (an MLP's parameter-free layer) kept with the block before it (GPipe's partitioning
// by cost, arXiv:1811.06965). A GPT model's blocks are its embedding, n_layer transformer blocks and
// its head. With a memory term (StageMemory) the cut is chosen among those whose every stage fits the rank's memory:
// the most expensive stage's compute minimised subject to each stage's bytes <= the budget, or by compute alone when no
// cut fits (as Megatron-LM's
// uneven first/last stages and DeepSpeed's partition by parameters trade compute for memory, arXiv:2104.04473).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/block.hpp"

namespace relay {

struct ChunkRange {
  int begin = 0, end = 0;  // block indices [begin, end)
};

// The memory term: a stage of blocks [begin, end) on pipeline rank r holds held + slots[r] x per_slot bytes, as
// `bytes` states them (train/memory_plan.hpp: the memory plan's own rules). Only for one chunk a rank
// (virtual_stages = 1): a rank's chunks under interleaving are cut by compute alone.
struct StageBytes {
  double held = 0;      // parameters, gradients, optimizer state, scratch, the boundary and loss buffers
  double per_slot = 0;  // activations kept for each micro-batch in flight
};
struct StageMemory {
  double budget = 0;                                 // bytes a rank may hold; 0: no memory term
  std::function<StageBytes(int begin, int end)> bytes;
  std::vector<double> slots;                         // (stages) micro-batches in flight on the stage's rank
  bool on() const { return budget > 0 && bytes; }
};

// Throws relay::Error naming parallel.balance / parallel.pp when a partition is impossible.
// measured_costs: per block, replacing the FLOP estimate (relay plan --measure).
std::vector<ChunkRange> partition_blocks(const std::vector<BlockSpec>& blocks, int chunks,
                                         const std::vector<int64_t>& balance,
                                         const std::vector<double>& measured_costs = {},
                                         const StageMemory& memory = {});


std::string describe_partition(const std::vector<ChunkRange>& parts, const std::vector<BlockSpec>& blocks, int pp);

}  // namespace relay
