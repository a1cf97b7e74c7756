#include "train/model_layout.hpp"

#include <cstdlib>

namespace relay {

int ModelLayout::chunk_of_layer(int layer) const {
  for (int c = 0; c < num_chunks(); ++c)
    if (layer >= chunks[static_cast<size_t>(c)].begin && layer < chunks[static_cast<size_t>(c)].end) return c;
  RELAY_ASSERT(false, "layer " << layer << " is in no chunk");
}

std::vector<std::pair<std::string, Shape>> ModelLayout::params() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& s = shapes[i];
    if (layers[i].type == "linear") {
      out.emplace_back(cat(i, ".weight"), Shape{s.out, s.in});
      out.emplace_back(cat(i, ".bias"), Shape{s.out});
    } else if (layers[i].type == "layernorm") {
      out.emplace_back(cat(i, ".weight"), Shape{s.in});
      out.emplace_back(cat(i, ".bias"), Shape{s.in});
    }
  }
  return out;
}

int ModelLayout::layer_of_param(const std::string& name) const { return std::atoi(name.c_str()); }

int64_t ModelLayout::param_count() const {
  int64_t n = 0;
  for (size_t i = 0; i < layers.size(); ++i) n += layer_param_count(layers[i], shapes[i]);
  return n;
}

double ModelLayout::forward_flops_per_sample() const {
  double f = 0;
  for (size_t i = 0; i < layers.size(); ++i) f += layer_flops(layers[i], shapes[i]);
  return f;
}

int64_t model_output_dim(const std::vector<LayerConfig>& layers) {
  for (size_t i = layers.size(); i-- > 0;)
    if (layers[i].type == "linear") return layers[i].out;
  throw Error("model.layers needs at least one linear layer");
}

ModelLayout make_layout(const Config& cfg, int64_t input_dim, const std::vector<double>& measured_costs) {
  ModelLayout l;
  l.layers = cfg.model.layers;
  l.input_dim = input_dim;
  l.shapes = infer_shapes(l.layers, input_dim);
  l.output_dim = l.shapes.back().out;
  l.pp = static_cast<int>(cfg.parallel.pp);
  l.v = static_cast<int>(cfg.parallel.virtual_stages);
  l.chunks = partition_layers(l.layers, l.shapes, l.pp * l.v, cfg.parallel.balance, measured_costs);
  return l;
}

ScheduleShape schedule_shape(const Config& cfg) {
  ScheduleShape s{parse_schedule_kind(cfg.parallel.schedule), static_cast<int>(cfg.parallel.pp),
                  static_cast<int>(cfg.parallel.virtual_stages), static_cast<int>(cfg.train.micro_batches)};
  validate_schedule_shape(s);
  return s;
}

int64_t micro_batch_rows(const Config& cfg) {
  // B = dp x micro_batches x micro-batch size.
  const int64_t B = cfg.train.batch_size, m = cfg.train.micro_batches, dp = cfg.parallel.dp;
  if (B % (dp * m) != 0)
    throw Error(cat("train.batch_size = ", B, " must be divisible by parallel.dp x train.micro_batches = ", dp, " x ", m,
                    " = ", dp * m, " (each replica splits its share into equal micro-batches)"));
  return B / (dp * m);
}

}  // namespace relay
