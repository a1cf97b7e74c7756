// Layers of the sequential model. Parameters are named like the state_dict of a torch.nn.Sequential
// holding the same layers ("{i}.weight" [out, in], "{i}.bias" [out]); initialisation follows
// torch.nn.Linear / torch.nn.LayerNorm defaults and is a pure function of (model.seed, layer index).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/config.hpp"

namespace relay {

struct Param {
  std::string name;  // "{i}.weight", "{i}.bias"
  Tensor value;      // fp32, the torch shape
  Tensor grad;       // same shape; storage owned by the gradient buckets (data_parallel)
};

struct LayerShape {
  int64_t in = 0, out = 0;
};

// Per-micro-batch tensors a layer saves for its backward pass beyond its input (layernorm statistics).
struct LayerSaved {
  Tensor mean, rstd;  // (rows)
};

class Layer {
 public:
  Layer(int index, LayerShape shape) : index_(index), shape_(shape) {}
  virtual ~Layer() = default;
  int index() const { return index_; }
  const LayerShape& shape() const { return shape_; }
  virtual const char* type() const = 0;
  std::vector<Param>& params() { return params_; }

  virtual void allocate_saved(Backend&, int64_t rows, LayerSaved&) {}
  // x (rows, in) -> y (rows, out)
  virtual void forward(Backend& be, const Tensor& x, Tensor& y, LayerSaved& saved) = 0;
  // dy (rows, out) -> dx (rows, in). x is this layer's saved input.
  virtual void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, LayerSaved& saved) = 0;
  // Accumulates the parameter gradients from dy (rows, out) and the saved input x (rows, in).
  virtual void backward_weight(Backend&, const Tensor&, const Tensor&, LayerSaved&) {}

 protected:
  int index_;
  LayerShape shape_;
  std::vector<Param> params_;
};

// Widths of every layer given the input width (linear changes it, the rest keep it).
std::vector<LayerShape> infer_shapes(const std::vector<LayerConfig>& layers, int64_t input_dim);
// Forward FLOPs per sample, for balancing stages and for throughput figures.
double layer_flops(const LayerConfig& layer, const LayerShape& shape);
bool layer_has_params(const LayerConfig& layer);
int64_t layer_param_count(const LayerConfig& layer, const LayerShape& shape);

// Builds layer `index` with its parameters allocated on `be` and initialised from (model_seed, index).
std::unique_ptr<Layer> make_layer(Backend& be, const LayerConfig& cfg, int index, LayerShape shape,
                                  uint64_t model_seed);

}  // namespace relay
