// Linear, activation and layernorm layers on top of the Backend operations.
#include <cmath>

#include "core/rng.hpp"
#include "model/layer.hpp"

namespace relay {

namespace {

// y = x W^T + b, as torch.nn.Linear. W (out, in), b (out).
class Linear final : public Layer {
 public:
  Linear(Backend& be, int index, LayerShape s, uint64_t seed) : Layer(index, s) {
    params_.push_back({cat(index, ".weight"), Tensor(be, {s.out, s.in}), {}});
    params_.push_back({cat(index, ".bias"), Tensor(be, {s.out}), {}});
    // torch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound.
    double bound = 1.0 / std::sqrt(double(s.in));
    Rng rng(seed, static_cast<uint64_t>(index));
    std::vector<float> w(static_cast<size_t>(s.out * s.in)), b(static_cast<size_t>(s.out));
    for (auto& x : w) x = float(rng.uniform(-bound, bound));
    for (auto& x : b) x = float(rng.uniform(-bound, bound));
    be.upload(params_[0].value, w.data());
    be.upload(params_[1].value, b.data());
  }
  const char* type() const override { return "linear"; }
  void forward(Backend& be, const Tensor& x, Tensor& y, LayerSaved&) override {
    be.matmul(x, false, params_[0].value, true, y, 1.f, 0.f);  // (rows, in) @ (in, out)
    be.add_bias(y, params_[1].value);
  }
  void backward_input(Backend& be, const Tensor&, const Tensor& dy, Tensor& dx, LayerSaved&) override {
    be.matmul(dy, false, params_[0].value, false, dx, 1.f, 0.f);  // (rows, out) @ (out, in)
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, LayerSaved&) override {
    be.matmul(dy, true, x, false, params_[0].grad, 1.f, 1.f);  // (out, rows) @ (rows, in), accumulated
    be.bias_grad(dy, params_[1].grad, 1.f);
  }
};

class ActivationLayer final : public Layer {
 public:
  ActivationLayer(int index, LayerShape s, Activation act, const char* name) : Layer(index, s), act_(act), name_(name) {}
  const char* type() const override { return name_; }
  void forward(Backend& be, const Tensor& x, Tensor& y, LayerSaved&) override { be.activation_forward(act_, x, y); }
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, LayerSaved&) override {
    be.activation_backward(act_, x, dy, dx);
  }

 private:
  Activation act_;
  const char* name_;
};

// torch.nn.LayerNorm(dim, eps): weight = 1, bias = 0 at initialisation.
class LayerNorm final : public Layer {
 public:
  LayerNorm(Backend& be, int index, LayerShape s, double eps) : Layer(index, s), eps_(float(eps)) {
    params_.push_back({cat(index, ".weight"), Tensor(be, {s.out}), {}});
    params_.push_back({cat(index, ".bias"), Tensor(be, {s.out}), {}});
    be.fill(params_[0].value, 1.f);
    be.fill(params_[1].value, 0.f);
  }
  const char* type() const override { return "layernorm"; }
  void allocate_saved(Backend& be, int64_t rows, LayerSaved& saved) override {
    saved.mean = Tensor(be, {rows});
    saved.rstd = Tensor(be, {rows});
  }
  void forward(Backend& be, const Tensor& x, Tensor& y, LayerSaved& s) override {
    Tensor mean = s.mean.rows(0, x.size(0)), rstd = s.rstd.rows(0, x.size(0));
    be.layernorm_forward(x, params_[0].value, params_[1].value, eps_, y, mean, rstd);
  }
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, LayerSaved& s) override {
    be.layernorm_backward_input(dy, x, params_[0].value, s.mean.rows(0, x.size(0)), s.rstd.rows(0, x.size(0)), dx);
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, LayerSaved& s) override {
    be.layernorm_backward_weight(dy, x, s.mean.rows(0, x.size(0)), s.rstd.rows(0, x.size(0)), params_[0].grad,
                                 params_[1].grad);
  }

 private:
  float eps_;
};

}  // namespace

std::vector<LayerShape> infer_shapes(const std::vector<LayerConfig>& layers, int64_t input_dim) {
  std::vector<LayerShape> out;
  int64_t w = input_dim;
  for (auto& l : layers) {
    LayerShape s{w, l.type == "linear" ? l.out : w};
    out.push_back(s);
    w = s.out;
  }
  return out;
}

double layer_flops(const LayerConfig& l, const LayerShape& s) {
  if (l.type == "linear") return 2.0 * double(s.in) * double(s.out);
  if (l.type == "layernorm") return 8.0 * double(s.in);
  if (l.type == "gelu") return 10.0 * double(s.in);
  return double(s.in);
}

bool layer_has_params(const LayerConfig& l) { return l.type == "linear" || l.type == "layernorm"; }

int64_t layer_param_count(const LayerConfig& l, const LayerShape& s) {
  if (l.type == "linear") return s.in * s.out + s.out;
  if (l.type == "layernorm") return 2 * s.in;
  return 0;
}

std::unique_ptr<Layer> make_layer(Backend& be, const LayerConfig& cfg, int index, LayerShape shape,
                                  uint64_t model_seed) {
  if (cfg.type == "linear") return std::make_unique<Linear>(be, index, shape, model_seed);
  if (cfg.type == "relu") return std::make_unique<ActivationLayer>(index, shape, Activation::relu, "relu");
  if (cfg.type == "gelu") return std::make_unique<ActivationLayer>(index, shape, Activation::gelu, "gelu");
  if (cfg.type == "tanh") return std::make_unique<ActivationLayer>(index, shape, Activation::tanh, "tanh");
  if (cfg.type == "layernorm") return std::make_unique<LayerNorm>(be, index, shape, cfg.eps);
  throw Error(cat("model.layers[", index, "]: unknown layer type \"", cfg.type, "\""));
}

}  // namespace relay
