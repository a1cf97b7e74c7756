// Cuts the model's blocks into pp x v contiguous chunks (chunk c runs on pipeline rank c % pp):
// from parallel.balance (blocks per chunk), or balanced by forward FLOPs with every block that cannot
// start a stage (an MLP's parameter-free layer) kept with the block before it (GPipe's partitioning
// by cost, arXiv:1811.06965). A GPT model's blocks are its embedding, n_layer transformer blocks and
// its head.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/block.hpp"

namespace relay {

struct ChunkRange {
  int begin = 0, end = 0;  // block indices [begin, end)
};

// Throws relay::Error naming parallel.balance / parallel.pp when a partition is impossible.
// measured_costs: per block, replacing the FLOP estimate (relay plan --measure).
std::vector<ChunkRange> partition_blocks(const std::vector<BlockSpec>& blocks, int chunks,
                                         const std::vector<int64_t>& balance,
                                         const std::vector<double>& measured_costs = {});

std::string describe_partition(const std::vector<ChunkRange>& parts, const std::vector<BlockSpec>& blocks, int pp);

}  // namespace relay
