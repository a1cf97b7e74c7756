// The sparse MLP of a mixture-of-experts decoder layer (Shazeer et al., arXiv:1701.06538; Mixtral, arXiv:2401.04088;
// transformers' MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock are the reference modules):
//   logits = x W_gate^T (n, E);  p = softmax(logits) in f32;  the token's k most probable experts, their weights
//   p (divided by their sum when renormalising);  y[t] = sum over its k experts e of w_e SwiGLU_e(x[t]),
//   SwiGLU_e(x) = down_e(silu(gate_e(x)) * up_e(x)).
// DeepSeek-V3 (arXiv:2412.19437; transformers' DeepseekV3MoE, MoeSpec::score = sigmoid): p = sigmoid(logits) in f32,
// the k experts by the group-limited top-k of p + e_score_correction_bias (moe.expert_bias: the choice only), their
// weights p / (their sum + 1e-20) when renormalising, times routed_scaling_factor; and (either score) y[t] +=
// shared(x[t]), one SwiGLU of n_shared x ffn_hidden units on every token (mlp.shared_experts).
// Dropless: every token reaches all of its k experts. Tokens are sorted by expert (stable: by token, then by rank in
// its top-k) so that each expert runs its GEMMs on one contiguous block of rows.
//
// Expert parallelism (model/expert_parallel.hpp): the sorted rows of experts held elsewhere go to their ranks in one
// all-to-all (after one of the counts), arrive rank after rank, are regrouped expert after expert for the GEMMs, and
// their outputs travel back the same way; the backward sends the outputs' gradients and returns the inputs'. With
// parallel.overlap (MoeSpec::parts = 2) in two parts, the rows of each rank's first half of its experts and the rest's:
// one part's all-to-all travels (non-blocking, on the progress thread) while the other part's experts run, and every
// expert's GEMMs see the same rows in the same order as with one part, so the results are the same bits.
//
// Load balancing, per sequence (DeepSeek-V3's sequence-wise loss, Megatron-core's seq_aux_loss): for a sequence of T
// tokens, c_e the number of its tokens whose top-k holds e, aux = E / (k T^2) sum_e c_e sum_t p[t, e] (1 when
// perfectly balanced); the loss adds aux_weight x aux per sequence (the counts are constants: no gradient through
// the top-k choice) and z_weight x lse^2 per token (the router z-loss, ST-MoE arXiv:2202.08906). With sigmoid scores,
// DeepSeek-V3's complementary sequence-wise loss (its report's equations 17-20, Megatron-core's sigmoid
// seq_aux_loss): p[t, e] is the normalised s'[t, e] = p[t, e] / (sum_i p[t, i] + 1e-20) and c_e counts the tokens
// whose k best unbiased scores, over all experts, hold e (not the biased, group-limited choice); no z-loss (refused).
// Under context
// parallelism a rank holds T / cp rows of each sequence: c_e and sum_t p[t, e] are summed over the cp group first.
#pragma once
#include <span>
#include <vector>

#include "model/block.hpp"
#include "model/context_parallel.hpp"
#include "model/expert_parallel.hpp"
#include "model/fp8_linear.hpp"

namespace relay {

class MoeMlp {
 public:
  // params: the router (E, C), the shared experts' gate (Fs, C), up (Fs, C) and down (C, Fs) when spec.moe.n_shared
  // (Fs = n_shared x F; on every ep rank, like the layer's other non-expert parameters), then each of this rank's
  // experts' gate (F, C), up (F, C) and down (C, F) (every expert's without expert parallelism).
  // tp: each expert's SwiGLU split over the tensor-parallel group like the dense one (gate and up by rows, down by
  // columns: moe_ffn_hidden / tp units here); the outputs (and input gradients) are then this rank's partial sums,
  // which the caller reduces over the group; the router is whole on every tp rank; the shared experts' SwiGLU is
  // split the same way (Fs / tp units here).
  // cp: the rank's context-parallel group; a sequence's load-balancing statistics are summed over it first.
  MoeMlp(const BlockSpec& spec, std::span<Param* const> params, const ExpertParallel& ep = {},
         const TensorParallel& tp = {}, const ContextParallel& cp = {});
  // The number of params above for a rank of the ep group.
  static size_t param_count(const MoeSpec& moe, const ExpertParallel& ep = {}) {
    return size_t(1 + (moe.n_shared > 0 ? 3 : 0) + 3 * ep.local_experts(moe.n_experts));
  }
  // The buffers a micro-batch of n rows keeps (saved[first, first + count)): routing, gathered rows, gradients; under
  // expert parallelism (spec.moe.ep) the rows this rank's experts may receive (dropless: at most ep n min(k, E/ep)).
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n, int tp = 1);
  // Of those, the bytes only expert parallelism needs (the rows received, their staging and their maps): relay plan.
  static int64_t exchange_bytes(const BlockSpec& spec, int64_t n, int tp = 1);
  // x (n, C) -> y (n, C), from the saved buffers `s` (saved_shapes' order); under tp, this rank's partial sum.
  void forward(Backend& be, const Tensor& x, Tensor& y, Tensor* s);
  // dy (n, C) -> dx (n, C), the input's gradient through the experts and the router (under tp this rank's partial
  // sum: the router's term on tp rank 0 only); adds the step's router statistics.
  void backward_input(Backend& be, const Tensor& dy, Tensor& dx, Tensor* s);
  // Accumulates the router's, the shared experts' and the routed experts' weight gradients.
  void backward_weight(Backend& be, const Tensor& x, Tensor* s);
  void take_stats(std::vector<RouterStats>& out);
  // moe.expert_bias: this layer's bias (E floats), added to the probabilities for the top-k choice only.
  // DeepSeek-V3's e_score_correction_bias is this bias (checkpointed as row `layer` of router/expert_bias).
  void set_bias(Backend& be, const float* bias);

 private:
  // The routing plan of a micro-batch, from its saved offsets (and the counts the other ranks sent): local expert j's
  // rows [local_[j], local_[j + 1]) of the rows here; under ep the rows sent to and received from each rank.
  void download_plan(Backend& be, Tensor* s);
  void make_exchange_plan();  // from offsets_ and recv_counts_
  // Local expert j of part h: rows [local_of(h)[j], local_of(h)[j + 1]) (E / ep + 1 entries).
  std::vector<int64_t> local_of(int64_t h) const;
  // Part h's rows as a range {first row, count}: of the sorted (R, C) rows here (by part, then expert), and of the
  // local (Rl, C) rows (and the staging rows of their arrivals).
  struct RowRange {
    int64_t begin, count;
  };
  RowRange sorted_part(int64_t h) const;
  RowRange local_part(int64_t h) const;
  // One part's all-to-all in flight (parallel.overlap: part 1's travels while part 0's experts run).
  struct Exchange {
    int64_t part = 0;
    int64_t mark = 0;  // the trace's clock at its start
    RequestPtr req;
  };
  // Under ep: part h's rows of `sorted` (R, C; by part, then expert) started to the ranks holding their experts, into
  // the staging rows of its arrivals (dispatch); after the wait, regrouped expert after expert into local (Rl, C).
  Exchange start_dispatch(int64_t h, const Tensor& sorted, Tensor* s, const char* what);
  void finish_dispatch(Backend& be, Exchange& x, Tensor& local, Tensor* s);
  // And back (combine): part h's rows of local (Rl, C) to the ranks they came from, into their rows of sorted.
  Exchange start_undispatch(Backend& be, int64_t h, const Tensor& local, Tensor& sorted, Tensor* s, const char* what);
  void wait_exchange(Exchange& x, const char* name);  // name: its span on the trace's communication track
  // Part h's rows through the local experts: xl (Rl, C) -> the saved gate, up, h (Rl, F) and the outputs (Rl, C);
  // backward: gyl (Rl, C) -> d gate, d up (Rl, F) and gxl (Rl, C).
  void experts_forward(Backend& be, const Tensor& xl, int64_t h, Tensor* s);
  void experts_backward(Backend& be, const Tensor& gyl, Tensor& gxl, int64_t h, Tensor* s);
  // Part h's ep entries of counts (parts, ep).
  static std::vector<int64_t> part_of(const std::vector<int64_t>& counts, int64_t h, int ep) {
    return {counts.begin() + h * ep, counts.begin() + (h + 1) * ep};
  }
  int64_t local_rows() const { return local_.back(); }
  // The top-k's margin of token t (RouterStats::min_margin) from the host's probs_, experts_ and host_bias_: with
  // sigmoid scores also the groups' and, under the aux loss, its own top-k's (plain_top_, found once per token by
  // backward_input's statistics). scratch: reused by the caller's loop over the tokens (no allocation per token).
  struct MarginScratch {
    std::vector<double> gscore;  // (n_group) each group's two best choice scores summed
    std::vector<int64_t> order;  // (n_group) the groups, best first
    std::vector<char> kept;      // (n_group) among the topk_group best
  };
  double choice_margin(int64_t t, MarginScratch& scratch) const;
  // The k experts of the largest p (E) (the lower expert first on a tie) into top (k): DeepSeek-V3's aux loss counts
  // these.
  void plain_top_k(const float* p, std::vector<int64_t>& top) const;
  Backend::GroupRouting group_routing() const {
    return {moe_.k, moe_.n_group, moe_.topk_group, moe_.renormalize, float(moe_.routed_scaling)};
  }
  bool sigmoid() const { return moe_.score == MoeSpec::Score::sigmoid; }

  ExpertParallel ep_;
  TensorParallel tp_;
  ContextParallel cp_;
  int64_t parts_ = 1;  // MoeSpec::parts: 2 under ep with parallel.overlap (each rank's experts in two halves), else 1
  int64_t E_local_ = 0, first_ = 0;

  MoeSpec moe_;
  int64_t C_, T_;
  Fp8Linear fp8_;  // the experts' grouped GEMMs: FP8 under train.precision = "fp8" (the router's stay in bf16)
  Param* router_;
  Param *shared_gate_ = nullptr, *shared_up_ = nullptr, *shared_down_ = nullptr;  // n_shared > 0
  std::vector<Param*> gate_, up_, down_;  // by local expert
  // Host scratch: the routing plan of the micro-batch at hand.
  std::vector<int32_t> experts_, pos_, src_, offsets_;
  std::vector<int32_t> recv_counts_;               // (ep, parts, E / ep) rows each rank sends this rank's experts
  std::vector<int64_t> send_rows_, recv_rows_;     // (parts, ep) rows to and from each rank
  std::vector<int64_t> local_;                     // (parts x E / ep + 1) part h's local expert j's rows here
  std::vector<float> probs_, lse_, seq_grad_;
  std::vector<int64_t> plain_top_;  // (n, k) sigmoid scores: each token's plain_top_k, from the aux statistics' loop
  Tensor bias_;                   // (E) f32 on the device: moe.expert_bias's, undefined until set_bias
  std::vector<float> host_bias_;  // (E) the same values (the top-k margin is over the biased scores)
  RouterStats stats_;
};

}  // namespace relay
