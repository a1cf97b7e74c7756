// Cuts the model's layers into pp x v contiguous chunks (chunk c runs on pipeline rank c % pp):
// from parallel.balance, or balanced by forward FLOPs with every parameter-free layer kept with the
// parametrised layer before it (GPipe's partitioning by cost, arXiv:1811.06965).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/layer.hpp"

namespace relay {

struct ChunkRange {
  int begin = 0, end = 0;  // config layer indices [begin, end)
};

// Throws relay::Error naming parallel.balance / parallel.pp when a partition is impossible.
std::vector<ChunkRange> partition_layers(const std::vector<LayerConfig>& layers, const std::vector<LayerShape>& shapes,
                                         int chunks, const std::vector<int64_t>& balance,
                                         const std::vector<double>& measured_costs = {});

std::string describe_partition(const std::vector<ChunkRange>& parts, const std::vector<LayerConfig>& layers, int pp);

}  // namespace relay
