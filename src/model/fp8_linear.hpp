// A linear layer's three GEMMs (forward y = x W^T, input gradient dx = dy W, weight gradient dW += dy^T x) in the
// working precision, or, under train.precision = "fp8", on FP8 operands: each operand quantised for its use as
// train.fp8_recipe says (core/fp8_scaling.hpp: torchao's / Megatron's tensorwise recipe, or DeepSeek-V3's blockwise
// one, arXiv:2412.19437 section 3.3.2) and multiplied by Backend::fp8_matmul, f32 accumulation, the result written
// in the working dtype where the bf16 path writes it.
#pragma once
#include <optional>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/precision.hpp"

namespace relay {

struct BlockSpec;

// A weight's FP8 tiling under the recipe (one tensorwise scale, or 128 x 128 blocks; e4m3 either way), whatever GEMM
// reads it: what Fp8Linear quantises and caches.
inline Fp8Tiling fp8_weight_tiling(Fp8Recipe recipe) {
  return recipe == Fp8Recipe::tensorwise ? Fp8Tiling::tensor : Fp8Tiling::block_128x128;
}
// Bytes of a cached weight (out, in) of the recipe (Fp8WeightCache): its e4m3 codes and its scales' f32 grid.
inline int64_t fp8_weight_cache_bytes(Fp8Recipe recipe, int64_t out, int64_t in) {
  const Fp8Grid g = fp8_grid(fp8_weight_tiling(recipe), out, in);
  return out * in + 4 * g.rows * g.cols;
}
struct Fp8WeightCache;
struct Param;

// A GEMM's weight as Fp8Linear takes it: the working copy, or, under parallel.fp8_param_gather, the e4m3 codes that
// ZeRO-3 gathered with their tensorwise scale (the codes and scale Fp8Linear would make from the working copy), which
// the forward and the input gradient multiply as they are.
// A Param marked fp8_cached (a linear's or an expert's weight) also brings its cache (model/param.hpp's
// Fp8WeightCache): its codes and scales, made by the first GEMM that reads the working copy's version and taken as
// they are by the others.
struct Fp8Weight {
  const Tensor& w;                // (out, in): bf16 / f32, or e4m3 codes
  const Tensor* scale = nullptr;  // (1, 1) f32: w's tensorwise scale when w holds codes
  const Param* cached = nullptr;  // the Param whose cache holds w's codes (null: a slice, quantised per use)
  Fp8Weight(const Tensor& t) : w(t) {}  // NOLINT(google-explicit-constructor): a working copy passes as it is
  Fp8Weight(const Param& p);            // NOLINT(google-explicit-constructor): its compute copy, codes or not
};

// Operands, formats and tilings per GEMM (K: the GEMM's reduction dimension; each operand is quantised for the GEMM
// that reads it, so a blockwise operand's tiles run along that GEMM's own K):
//   GEMM              a (K along)         b (K along)          tensorwise       blockwise
//   forward           x (n, in): cols     W (out, in): cols    x, W e4m3        x 1 x 128, W 128 x 128, e4m3
//   input gradient    dy (n, out): cols   W (out, in): rows    dy e5m2, W e4m3  dy 1 x 128, W 128 x 128, e4m3
//   weight gradient   dy^T: dy's rows     x (n, in): rows      dy e5m2, x e4m3  dy, x 128 x 1, e4m3
// A 128 x 128 block serves W along either dimension; x and dy are quantised again for the weight gradient (1 x 128
// tiles along columns do not share scales along rows). Tensorwise scales are the whole tensor's amax: under tensor
// parallelism (tp, the block's group) each operand's scale is that of the maximum over the group of its shards' amax
// (Backend::fp8_amax, one i32 all-reduce, then Backend::fp8_quantize_amax: the shard read once for each), so that a sharded operand (a column-parallel W, a row-parallel input, a sharded output gradient) is
// quantised with the serial run's scale for the whole tensor (torchao's rule for sharded tensors); a replicated
// operand's scale is the same on every rank anyway. Blockwise tiles end at a shard's edge (128-wide shards match the
// serial tiles exactly).
// A weight's codes do not depend on its use (e4m3; tensorwise one scale, blockwise 128 x 128 blocks, which serve K
// along either dimension), so a Param's are made once per optimizer step (Fp8WeightCache) and serve the forward and
// the input gradient of every micro-batch. This lives above the backend: the CUDA backend gets it as it is.
class Fp8Linear {
 public:
  Fp8Linear() = default;  // off: every GEMM is the backend's own, in the working dtype
  explicit Fp8Linear(std::optional<Fp8Recipe> recipe, Communicator* tp = nullptr) : recipe_(recipe), tp_(tp) {}
  bool on() const { return recipe_.has_value(); }

  // y (n, out) = act(x (n, in) @ W (out, in)^T + bias (out)), bias possibly undefined; pre_act (n, out): the
  // activation's input when act is not none (Backend::linear). In FP8 as in bf16 the bias is added to the GEMM's
  // fp32 sums and the sum rounded to y's dtype once.
  void linear(Backend& be, const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& y,
              LinearAct act = LinearAct::none, Tensor* pre_act = nullptr) const;
  // dx (n, in) = act'(act_in) * (dy (n, out) @ W (out, in)) (Backend::linear_backward_input).
  void linear_backward_input(Backend& be, const Tensor& dy, const Fp8Weight& w, Tensor& dx, LinearAct act,
                             const Tensor& act_in) const;
  // y (n, m) = x (n, k) @ op(W) + beta * y: trans_w, W (m, k), op(W) = W^T: a forward (x an activation); otherwise
  // W (k, m): an input gradient (x an output gradient).
  void matmul(Backend& be, const Tensor& x, const Fp8Weight& w, bool trans_w, Tensor& y, float beta = 0.f) const;
  // dW (out, in) += dy (n, out)^T @ x (n, in); dW f32.
  void weight_grad(Backend& be, const Tensor& dy, const Tensor& x, Tensor& dw) const;
  // A mixture of experts' grouped GEMMs (Backend::grouped_matmul, grouped_matmul_weight with beta 1), group g being
  // rows [offsets[g], offsets[g + 1]): in FP8 one group at a time, each group's operands quantised on their own
  // (a tensorwise scale per expert's rows and weight); b: the experts' Params, whose codes are cached (fp8_expert).
  void grouped_matmul(Backend& be, const Tensor& a, const std::vector<Param*>& b, bool trans_b, Tensor& y,
                      const std::vector<int64_t>& offsets, float beta) const;
  void grouped_weight_grad(Backend& be, const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                           const std::vector<Tensor>& dw) const;

 private:
  std::optional<Fp8Recipe> recipe_;
  Communicator* tp_ = nullptr;  // the block's tensor-parallel group (null: none), over which tensorwise scales agree
};

// The recipe of a block's linear layers: train.precision = "fp8"'s, for the blocks whose linears run in FP8 (block.hpp's
// BlockSpec::fp8), else none.
Fp8Linear fp8_linear(const BlockSpec& spec, Communicator* tp = nullptr);

// train.precision = "fp8": throws a user error naming the block and the width when a linear layer's width is not a
// multiple of 16 (cuBLASLt's FP8 GEMMs need every dimension but the rows so).
void check_fp8_widths(const std::vector<BlockSpec>& blocks);

}  // namespace relay
