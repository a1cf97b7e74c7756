// The MLP's blocks, one per config layer: linear (torch.nn.Linear), relu/gelu/tanh and layernorm
// (torch.nn.LayerNorm), on top of the Backend operations.
#include "model/blocks.hpp"
#include "model/fp8_linear.hpp"

namespace relay {

namespace {

// y = x W^T + b, as torch.nn.Linear. W (out, in), b (out). Its GEMMs in FP8 under train.precision = "fp8".
class Linear final : public Block {
 public:
  Linear(const BlockSpec& spec, std::vector<Param*> params) : Block(spec, std::move(params)), fp8_(fp8_linear(spec)) {}
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved&) override {
    fp8_.linear(be, x, param(0), param(1).compute(), y);  // (rows, in) @ (in, out) + bias (out)
  }
  void backward_input(Backend& be, const Tensor&, const Tensor& dy, Tensor& dx, BlockSaved&) override {
    fp8_.matmul(be, dy, param(0), false, dx);  // (rows, out) @ (out, in)
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved&) override {
    fp8_.weight_grad(be, dy, x, param(0).grad);  // (out, rows) @ (rows, in), accumulated
    be.bias_grad(dy, param(1).grad, 1.f);
  }

 private:
  Fp8Linear fp8_;
};

class ActivationBlock final : public Block {
 public:
  ActivationBlock(BlockSpec spec, Activation act) : Block(std::move(spec), {}), act_(act) {}
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved&) override { be.activation_forward(act_, x, y); }
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved&) override {
    be.activation_backward(act_, x, dy, dx);
  }

 private:
  Activation act_;
};

// torch.nn.LayerNorm(dim, eps). saved: mean, rstd (rows).
class LayerNormBlock final : public Block {
 public:
  using Block::Block;
  void allocate_saved(Backend& be, int64_t rows, BlockSaved& s) override {
    allocate_buffers(be, mlp_saved_shapes(spec_, rows), s.t);
  }
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    const int64_t n = x.size(0);
    Tensor mean = s.t[0].rows(0, n), rstd = s.t[1].rows(0, n);
    be.layernorm_forward(x, param(0).compute(), param(1).compute(), float(spec_.eps), y, mean, rstd);
  }
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t n = x.size(0);
    be.layernorm_backward_input(dy, x, param(0).compute(), s.t[0].rows(0, n), s.t[1].rows(0, n), dx);
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved& s) override {
    const int64_t n = x.size(0);
    be.layernorm_backward_weight(dy, x, s.t[0].rows(0, n), s.t[1].rows(0, n), param(0).grad, param(1).grad);
  }
};

}  // namespace

std::unique_ptr<Block> make_mlp_block(const BlockSpec& spec, std::vector<Param*> params) {
  switch (spec.kind) {
    case BlockKind::linear: return std::make_unique<Linear>(spec, std::move(params));
    case BlockKind::relu: return std::make_unique<ActivationBlock>(spec, Activation::relu);
    case BlockKind::gelu: return std::make_unique<ActivationBlock>(spec, Activation::gelu);
    case BlockKind::tanh: return std::make_unique<ActivationBlock>(spec, Activation::tanh);
    case BlockKind::layernorm: return std::make_unique<LayerNormBlock>(spec, std::move(params));
    default: break;
  }
  RELAY_ASSERT(false, "make_mlp_block: not an MLP block kind: " << block_kind_name(spec.kind));
}

std::vector<BufferSpec> mlp_saved_shapes(const BlockSpec& spec, int64_t rows) {
  if (spec.kind == BlockKind::layernorm) return {{{rows}}, {{rows}}};  // mean, rstd (f32)
  return {};
}

}  // namespace relay
