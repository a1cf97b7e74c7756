// The whole model as every rank sees it: layer shapes, the cut into pipeline chunks, and the global
// list of parameter names and shapes (the checkpoint manifest). Pure: no MPI, no allocation.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "model/layer.hpp"
#include "parallel/partition.hpp"
#include "parallel/schedule.hpp"

namespace relay {

struct ModelLayout {
  std::vector<LayerConfig> layers;
  std::vector<LayerShape> shapes;
  int64_t input_dim = 0, output_dim = 0;
  int pp = 1, v = 1;
  std::vector<ChunkRange> chunks;  // pp * v contiguous ranges

  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int chunk_of_layer(int layer) const;
  int pp_rank_of_chunk(int c) const { return c % pp; }
  // Every parameter of the model in layer order: ("0.weight", [out, in]), ...
  std::vector<std::pair<std::string, Shape>> params() const;
  int layer_of_param(const std::string& name) const;  // "3.bias" -> 3
  int64_t param_count() const;
  double forward_flops_per_sample() const;
};

// Output width = the last linear layer's out; needs no data.
int64_t model_output_dim(const std::vector<LayerConfig>& layers);
ModelLayout make_layout(const Config& cfg, int64_t input_dim, const std::vector<double>& measured_costs = {});

// The schedule's (kind, pp, v, m) from [parallel] and train.micro_batches, validated (Error naming keys).
ScheduleShape schedule_shape(const Config& cfg);
// Samples per micro-batch: train.batch_size / (parallel.dp x train.micro_batches); an Error naming the
// keys when it does not divide.
int64_t micro_batch_rows(const Config& cfg);

}  // namespace relay
