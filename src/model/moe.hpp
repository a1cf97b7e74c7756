// The sparse MLP of a mixture-of-experts decoder layer (Shazeer et al., arXiv:1701.06538; Mixtral, arXiv:2401.04088;
// transformers' MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock are the reference modules):
//   logits = x W_gate^T (n, E);  p = softmax(logits) in f32;  the token's k most probable experts, their weights
//   p (divided by their sum when renormalising);  y[t] = sum over its k experts e of w_e SwiGLU_e(x[t]),
//   SwiGLU_e(x) = down_e(silu(gate_e(x)) * up_e(x)).
// Dropless: every token reaches all of its k experts. Tokens are sorted by expert (stable: by token, then by rank in
// its top-k) so that each expert runs its GEMMs on one contiguous block of rows.
//
// Load balancing, per sequence (DeepSeek-V3's sequence-wise loss, Megatron-core's seq_aux_loss): for a sequence of T
// tokens, c_e the number of its tokens whose top-k holds e, aux = E / (k T^2) sum_e c_e sum_t p[t, e] (1 when
// perfectly balanced); the loss adds aux_weight x aux per sequence (the counts are constants: no gradient through
// the top-k choice) and z_weight x lse^2 per token (the router z-loss, ST-MoE arXiv:2202.08906).
#pragma once
#include <span>
#include <vector>

#include "model/block.hpp"

namespace relay {

class MoeMlp {
 public:
  // params: the router (E, C), then each expert's gate (F, C), up (F, C) and down (C, F).
  MoeMlp(const BlockSpec& spec, std::span<Param* const> params);
  // The buffers a micro-batch of n rows keeps (saved[first, first + count)): routing, gathered rows, gradients.
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n);
  // x (n, C) -> y (n, C), from the saved buffers `s` (saved_shapes' order).
  void forward(Backend& be, const Tensor& x, Tensor& y, Tensor* s);
  // dy (n, C) -> dx (n, C), the input's gradient through the experts and the router; adds the step's router
  // statistics. T: rows per sequence (the load-balancing loss's sequences).
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, Tensor* s);
  // Accumulates the router's and the experts' weight gradients.
  void backward_weight(Backend& be, const Tensor& x, Tensor* s);
  void take_stats(std::vector<RouterStats>& out);
  // moe.expert_bias: this layer's bias (E floats), added to the probabilities for the top-k choice only.
  void set_bias(Backend& be, const float* bias);

 private:
  // Expert e's rows, from the offsets of the last forward or download_offsets.
  int64_t count(int64_t e) const { return offsets_[size_t(e) + 1] - offsets_[size_t(e)]; }
  void download_offsets(Backend& be, Tensor* s);

  MoeSpec moe_;
  int64_t C_, T_;
  Param* router_;
  std::vector<Param*> gate_, up_, down_;  // by expert
  // Host scratch: the routing plan of the micro-batch at hand.
  std::vector<int32_t> experts_, pos_, src_, offsets_;
  std::vector<float> probs_, lse_, seq_grad_;
  Tensor bias_;                   // (E) f32 on the device: moe.expert_bias's, undefined until set_bias
  std::vector<float> host_bias_;  // (E) the same values (the top-k margin is over the biased scores)
  RouterStats stats_;
};

}  // namespace relay
