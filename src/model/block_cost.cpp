// Each block kind's GEMMs, streamed elements, attention and collectives (model/block_cost.hpp), and the model's FLOPs.
// Tensor parallelism as Megatron-LM (arXiv:1909.08053), sequence parallelism as arXiv:2205.05198, mixtures of
// experts as model/moe.hpp and model/expert_parallel.hpp run them.
#include "model/block_cost.hpp"

#include <cmath>
#include <set>
#include <string>

#include "model/expert_parallel.hpp"
#include "model/model_spec.hpp"

namespace relay {

namespace {

BlockCollective collective(ParallelDim dim, CollectiveOp op, bool backward, double count, double elements,
                      double bytes = 0) {
  BlockCollective c;
  c.dim = dim, c.op = op, c.backward = backward, c.count = count, c.elements = elements, c.bytes = bytes;
  return c;
}

// A decoder block's collectives. Tensor parallelism: the two row-parallel outputs all-reduced in the forward, the two
// column-parallel input gradients in the backward (under sequence parallelism an all-gather and a reduce-scatter in
// their place: the same bytes). Context parallelism (model/context_parallel.hpp): the forward all-gathers the
// micro-batch's keys and values over the group, the backward gathers them again and reduce-scatters their gradients.
// Without sequence parallelism the backward's two all-reduces travel behind the weight gradients of the column-parallel
// projections whose input gradient they sum (attention's: gemms attn_w, the MLP's: mlp_w; none for the experts); under
// it (GPT's and Llama's blocks: collective_gemms) the reduce-scatter half of each entry does.
// Under sequence parallelism the forward's all-gathers feed the same column-parallel GEMMs chunk by chunk (the
// collective matmul; collective_gemms: the block runs one), and its reduce-scatters come from the row-parallel GEMMs
// (attn_row: o_proj / c_proj, mlp_row: down / the MLP's c_proj; none for the experts) chunk by chunk; the backward's
// all-gathers (of the output gradient, of d res1) feed those row-parallel GEMMs' input gradients chunk by chunk.
void decoder_collectives(const BlockSpec& b, const BlockShard& s, double n, BlockCost& c, std::vector<int> attn_w,
                         std::vector<int> mlp_w, bool collective_gemms = false, std::vector<int> attn_row = {},
                         std::vector<int> mlp_row = {}) {
  const double act = n * double(b.in);  // one (rows, C) activation
  if (s.tp > 1) {
    for (int part = 0; part < 2; ++part) {
      c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, false, 1, act));
      if (s.sp > 1 && collective_gemms) {
        c.collectives.back().gather_feeds = part == 0 ? attn_w : mlp_w;
        c.collectives.back().scatter_from = part == 0 ? attn_row : mlp_row;
      }
    }
    for (int part = 0; part < 2; ++part) {
      c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, true, 1, act));
      if (s.sp == 1 || collective_gemms) c.collectives.back().behind_weight_grads = part == 0 ? attn_w : mlp_w;
      if (s.sp > 1 && collective_gemms) c.collectives.back().backward_gather_feeds = part == 0 ? attn_row : mlp_row;
    }
  }
  if (s.cp > 1) {
    const double kv = 2 * n * s.cp * double(c.attention.kv_heads) * double(c.attention.head_dim) / s.tp;
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::all_gather, false, 1, kv));
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::all_gather, true, 1, kv));
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::reduce_scatter, true, 1, kv));
  }
}

// PyTorch eager's extra traffic over Relay's fused kernels (Streaming::eager_extra_per_row), per row, in elements of
// the working dtype (bf16; an f32 tensor counts twice), for the math as torchtitan's Llama writes it:
// - an RMSNorm over w: x.float() (r 1, w 2), pow (r 2, w 2), mean (r 2), x * rsqrt (r 2, w 2), type_as (r 2, w 1),
//   * weight (r 1, w 1): 18 w in 7 kernels where the fused norm moves 2 w;
// - RoPE over w (q's or k's columns): float (r 1, w 2), the complex product (r 2, w 2), type_as (r 2, w 1): 10 w in 3
//   kernels against 2 w;
// - SwiGLU over F: silu (r 1, w 1) and mul (r 2, w 1): 5 F in 2 kernels against 3 F;
// - GPT's GELU MLP and LayerNorm are one kernel each in eager too (F.gelu, F.layer_norm; the biases inside addmm);
// - the attention's output transposed back and made contiguous (r 1, w 1 over the query heads' width), and under GQA
//   repeat_kv's copies of k and v (read the kv heads, write the query heads' width, each).
constexpr double kEagerNormExtra = 18 - 2, kEagerRopeExtra = 10 - 2, kEagerSwigluExtra = 5 - 3;
constexpr int kEagerNormKernels = 7 - 1, kEagerRopeKernels = 3 - 1, kEagerSwigluKernels = 2 - 1;

// The attention's own eager extras: the output made contiguous, repeat_kv's copies where kv heads < query heads.
double eager_attention_extra(double Hq, double Hkv) { return 2 * Hq + (Hkv < Hq ? 2 * (Hkv + Hq) : 0.0); }
int eager_attention_kernels(double Hq, double Hkv) { return 1 + (Hkv < Hq ? 2 : 0); }

// GPT-2's transformer block: c_attn (3C), c_proj, c_fc (4C), the MLP's c_proj. Streaming: ln_1 and ln_2 (read, write C
// each), the two residual adds (read 2C, write C each), the two row-parallel biases (C each way) on rows / sp; the qkv
// bias (3C / tp each way), the fc bias and GELU (4C / tp each way, twice).
void transformer(const BlockSpec& b, const BlockShard& s, double n, BlockCost& c) {
  const double C = double(b.in), t = double(s.tp), sp = double(s.sp);
  c.gemms = {{n, 3 * C / t, C}, {n, C, C / t}, {n, 4 * C / t, C}, {n, C, 4 * C / t}};
  c.forward_streaming = {(2 * 2 + 2 * 3 + 2 * 2) * C / sp + (2 * 3 + 4 * 4) * C / t, 12,
                         eager_attention_extra(C, C) / t, eager_attention_kernels(C, C)};
  c.mlp_hidden = 4 * b.in;
  decoder_collectives(b, s, n, c, {0}, {2}, /*collective_gemms=*/true, {1}, {3});
}

// Llama's decoder layer: q, k, v, o, then the dense SwiGLU (gate, up, down) or the mixture of experts (the router,
// whole on every tp rank, then each of the rank's E / ep experts' gate and up, and down, on its n k ep / E rows; tp
// splits each expert's units as the dense SwiGLU's). Streaming: two RMSNorms (2C each) and residual adds (3C each) on
// rows / sp; RoPE on q and k (read, write); SwiGLU (read gate and up, write F). A MoE layer besides: the router's
// softmax and top-k over E (read, write), the tokens' k rows gathered in expert order (k C each way), SwiGLU over k F
// per token, the k outputs weighted and summed (read k C, write C), and under ep the rows regrouped between arrival and
// expert order on the way in and out (k C each way, twice). Under ep the forward exchanges the row counts (E integers)
// and sends the routed rows (n k of them, C elements each) to their experts' ranks and back; the backward sends the
// outputs' gradients and returns the inputs'.
void llama_layer(const BlockSpec& b, const BlockShard& s, double n, BlockCost& c) {
  const double C = double(b.in), t = double(s.tp), sp = double(s.sp), ep = double(s.ep);
  const double hd = double(head_dim(b));
  const double Hq = double(b.n_head) * hd, Hkv = double(b.n_kv_head) * hd;
  c.gemms = {{n, Hq / t, C}, {n, Hkv / t, C}, {n, Hkv / t, C}, {n, C, Hq / t}};
  const double attn = (2 * 2 + 2 * 3) * C / sp + 2 * (Hq + Hkv) / t;
  const double eager_attn = 2 * kEagerNormExtra * C / sp + kEagerRopeExtra * (Hq + Hkv) / t +
                            eager_attention_extra(Hq, Hkv) / t;
  const int eager_attn_kernels = 2 * kEagerNormKernels + 2 * kEagerRopeKernels + eager_attention_kernels(Hq, Hkv);
  if (b.moe.on()) {
    const double E = double(b.moe.n_experts), k = double(b.moe.k), F = double(b.moe.ffn_hidden) / t, local = E / ep;
    const double rows = n * k * ep / E;  // (rows, C) per local expert
    c.routed_gemm = c.gemms.size() + 1;
    c.gemms.insert(c.gemms.end(), {{n, E, C}, {rows, F, C, 2 * local}, {rows, C, F, local}});
    c.forward_streaming = {attn + 2 * E + 2 * k * C + 3 * k * F + (k + 1) * C + (s.ep > 1 ? 4 * k * C : 0),
                           s.ep > 1 ? 14 : 12, eager_attn + kEagerSwigluExtra * k * F,
                           eager_attn_kernels + kEagerSwigluKernels};
    c.mlp_hidden = b.moe.ffn_hidden;
  } else {
    const double F = double(b.ffn_hidden);
    c.gemms.insert(c.gemms.end(), {{n, F / t, C}, {n, F / t, C}, {n, C, F / t}});
    c.forward_streaming = {attn + 3 * F / t, 9, eager_attn + kEagerSwigluExtra * F / t,
                           eager_attn_kernels + kEagerSwigluKernels};
    // backward_weight remakes the SwiGLU output from the kept gate and up (read 2F, write F).
    c.weight_streaming = {3.0 * F / t, 1};
    c.mlp_hidden = b.ffn_hidden;
  }
  if (b.moe.on()) decoder_collectives(b, s, n, c, {0, 1, 2}, {}, /*collective_gemms=*/true, {3}, {});
  else decoder_collectives(b, s, n, c, {0, 1, 2}, {4, 5}, /*collective_gemms=*/true, {3}, {6});
  if (b.moe.on() && s.ep > 1) {
    const double routed = n * double(b.moe.k) * C;
    const double counts = 8.0 * double(b.moe.n_experts);
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, false, 1, 0, counts));
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, false, 2, routed));
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, true, 2, routed));
  }
}

// DeepSeek-V3's layer with latent attention (model/mla_blocks.cpp): q_a and q_b (or q), kv_a (replicated, whole
// on every tp rank), kv_b, o, then the SwiGLU, or the mixture of experts (Llama's MoE layer's, plus the shared
// experts' SwiGLU of n_shared x moe_intermediate_size units on every row). Streaming: three RMSNorms over C and the
// two latents, two residual adds, RoPE on the rotary parts, the heads' keys and values assembled from kv_b's output
// (read, write), SwiGLU; the group-limited sigmoid router besides Llama's softmax and top-k: the choice scores with
// the correction bias (read E, write E), each group's two best summed and the kept groups' mask (read E, write E).
// Collectives: tp all-reduces the attention and MLP outputs in the forward; the backward all-reduces the MLP's input
// gradient (n, C) and, as mla_blocks.cpp's backward does, the replicated part's inputs' gradients: the rotary key's
// (n, qk_rope), the latent's (n, kv_lora_rank) and the query latent's (n, q_lora_rank), or without q_lora_rank the
// attention input's (n, C). Under sequence parallelism the two input norms and residual adds run on rows / sp, and
// the all-reduces of (n, C) become all-gathers and reduce-scatters of the same bytes (mla_blocks.cpp). cp gathers the
// heads' keys (qk_nope + qk_rope wide) and values (v_head_dim wide).
void mla_layer(const BlockSpec& b, const BlockShard& s, double n, BlockCost& c) {
  const MlaSpec& m = b.mla;
  const double C = double(b.in), t = double(s.tp), H = double(b.n_head) / t, F = double(b.ffn_hidden) / t;
  const double dqk = double(m.qk_head()), dv = double(m.v_head), r = double(m.kv_lora_rank), ql = double(m.q_lora_rank);
  c.gemms = {{n, r + double(m.qk_rope), C}, {n, H * (double(m.qk_nope) + dv), r}, {n, C, H * dv}};
  if (m.q_lora_rank > 0) c.gemms.insert(c.gemms.end(), {{n, ql, C}, {n, H * dqk, ql}});
  else c.gemms.push_back({n, H * dqk, C});
  const double sp = double(s.sp);
  const double attn =
      2 * (2 * C / sp + r + ql) + 2 * 3 * C / sp + 2 * 2 * H * double(m.qk_rope) + 2 * H * (double(m.qk_nope) + dv);
  const double Hqk = H * dqk, norms = 2 * C / sp + r + ql;  // the query heads' width; what the norms run over
  const double eager_attn = kEagerNormExtra * norms + kEagerRopeExtra * 2 * H * double(m.qk_rope) +
                            eager_attention_extra(H * dv, H * dv);
  const int eager_attn_kernels = (m.q_lora_rank > 0 ? 4 : 3) * kEagerNormKernels + 2 * kEagerRopeKernels +
                                 eager_attention_kernels(Hqk, Hqk);
  const int q_w = m.q_lora_rank > 0 ? 4 : 3, mlp_w = int(c.gemms.size());  // q_b's (or q's) and gate's indices
  if (b.moe.on()) {  // the router, the shared experts' SwiGLU on every row, the routed experts as Llama's MoE layer's
    const double E = double(b.moe.n_experts), k = double(b.moe.k), Fe = double(b.moe.ffn_hidden) / t;
    const double Fs = double(b.moe.shared_hidden()) / t, ep = double(s.ep), rows = n * k * ep / E;
    c.routed_gemm = c.gemms.size() + 1;
    c.gemms.insert(c.gemms.end(), {{n, E, C}, {rows, Fe, C, 2 * E / ep}, {rows, C, Fe, E / ep}});
    if (Fs > 0) c.gemms.insert(c.gemms.end(), {{n, Fs, C}, {n, Fs, C}, {n, C, Fs}});
    c.forward_streaming = {attn + 4 * E + 2 * k * C + 3 * k * Fe + (k + 1) * C + 3 * Fs + (s.ep > 1 ? 4 * k * C : 0),
                           s.ep > 1 ? 20 : 18, eager_attn + kEagerSwigluExtra * (k * Fe + Fs),
                           eager_attn_kernels + 2 * kEagerSwigluKernels};
    c.mlp_hidden = b.moe.ffn_hidden;
  } else {
    c.gemms.insert(c.gemms.end(), {{n, F, C}, {n, F, C}, {n, C, F}});
    c.forward_streaming = {attn + 3 * F, 12, eager_attn + kEagerSwigluExtra * F,
                           eager_attn_kernels + kEagerSwigluKernels};
    c.weight_streaming = {3.0 * F, 1};
    c.mlp_hidden = b.ffn_hidden;
  }
  if (s.tp > 1) {
    const double replicated = m.q_lora_rank > 0 ? double(m.qk_rope) + r + ql : double(m.qk_rope) + r + C;
    c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, false, 2, n * C));
    c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, true, 1, n * C));
    // (not under sequence parallelism: MLA's blocks keep the reduce-scatters blocking there)
    if (!b.moe.on() && s.sp == 1) c.collectives.back().behind_weight_grads = {mlp_w, mlp_w + 1};  // gate's and up's
    // The latent's and the query latent's (or attention input's) behind kv_b's and q_b's (or q's); k_pe's small part
    // (qk_rope of the columns) priced with them.
    c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, true, 1, n * replicated));
    if (s.sp == 1) c.collectives.back().behind_weight_grads = {1, q_w};
  }
  if (s.cp > 1) {
    const double kv = n * s.cp * H * (dqk + dv);  // this tp rank's heads' keys and values of the whole sequence
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::all_gather, false, 1, kv));
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::all_gather, true, 1, kv));
    c.collectives.push_back(collective(ParallelDim::cp, CollectiveOp::reduce_scatter, true, 1, kv));
  }
  if (b.moe.on() && s.ep > 1) {
    const double routed = n * double(b.moe.k) * C;
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, false, 1, 0, 8.0 * double(b.moe.n_experts)));
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, false, 2, routed));
    c.collectives.push_back(collective(ParallelDim::ep, CollectiveOp::all_to_all, true, 2, routed));
  }
}

}  // namespace

AttentionShape attention_shape(const BlockSpec& b) {
  switch (b.kind) {
    case BlockKind::transformer: return {b.n_head, b.n_head, head_dim(b), true};
    case BlockKind::llama_layer: return {b.n_head, b.n_kv_head, head_dim(b), false};
    case BlockKind::mla_layer: return {b.n_head, b.n_head, head_dim(b), false, b.mla.v_head};
    default: return {};
  }
}

BlockCost block_cost(const BlockSpec& b, const BlockShard& s, double n) {
  BlockCost c;
  c.forward_flops_per_row = b.flops;
  c.attention_flops_per_row = b.attn_flops;
  c.attention = attention_shape(b);
  const double C = double(b.in), t = double(s.tp);
  switch (b.kind) {
    case BlockKind::transformer: transformer(b, s, n, c); break;
    case BlockKind::llama_layer: llama_layer(b, s, n, c); break;
    case BlockKind::mla_layer: mla_layer(b, s, n, c); break;
    case BlockKind::head:
      // The vocabulary-parallel head: the final norm, the logits' GEMM on the rank's vocabulary shard, the loss over
      // it (logits read, softmax and gradient written, f32); under tp the loss's row maxima and sums summed over the
      // group in the forward (f32), the input gradient in the backward.
      c.gemms = {{n, std::ceil(double(b.out) / t), C}};
      // Eager: the final RMSNorm decomposed (a LayerNorm is one kernel there too), and the logits cast to f32 (r 1,
      // w 2) before log_softmax reads them twice and writes them (r 4, w 2): 9 V against the fused loss's 4 V.
      {
        const bool rms = b.norm == NormKind::rmsnorm;
        c.forward_streaming = {2 * C / s.sp + 4.0 * std::ceil(double(b.out) / t), 4,
                               (rms ? kEagerNormExtra * C / s.sp : 0.0) + 5.0 * std::ceil(double(b.out) / t),
                               (rms ? kEagerNormKernels : 0) + 2};
      }
      if (s.tp > 1) {
        c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, false, 2, 0, 4 * n));
        c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, true, 1, n * C));
      }
      break;
    case BlockKind::mtp:
      // DeepSeek-V3's multi-token prediction (model/mtp_block.cpp): per module its embedding lookup, eh_proj (n, C,
      // 2C) and the two norms before it, its decoder layer and the shared head with its loss, each as its own block.
      for (const BlockSpec& in : b.inner) {
        const BlockCost ic = block_cost(in, s, n);
        c.gemms.insert(c.gemms.end(), ic.gemms.begin(), ic.gemms.end());
        c.forward_streaming.elements_per_row += ic.forward_streaming.elements_per_row;
        c.forward_streaming.kernels += ic.forward_streaming.kernels;
        c.forward_streaming.eager_extra_per_row += ic.forward_streaming.eager_extra_per_row;
        c.forward_streaming.eager_extra_kernels += ic.forward_streaming.eager_extra_kernels;
        c.weight_streaming.elements_per_row += ic.weight_streaming.elements_per_row;
        c.weight_streaming.kernels += ic.weight_streaming.kernels;
        for (BlockCollective col : ic.collectives) {  // the inner layer runs B and W apart here: nothing hidden
          col.behind_weight_grads.clear();
          col.gather_feeds.clear();
          col.scatter_from.clear();
          col.backward_gather_feeds.clear();
          c.collectives.push_back(col);
        }
      }
      for (int64_t k = 0; k < b.mtp.depth; ++k) c.gemms.push_back({n, C, 2 * C});
      c.forward_streaming.elements_per_row += double(b.mtp.depth) * 8 * C;  // the norms and the concatenation
      c.forward_streaming.kernels += int(b.mtp.depth) * 4;
      break;
    case BlockKind::embedding:
      // The vocabulary-parallel embedding sums its output over the group. Its width `in` is 0 (token ids): the planner
      // has always counted its streaming and its sum at 0 elements, their launches and latency only.
      c.forward_streaming = {2 * C, 2};
      if (s.tp > 1) c.collectives.push_back(collective(ParallelDim::tp, CollectiveOp::all_reduce, false, 1, n * C));
      break;
    case BlockKind::linear:
      c.gemms = {{n, double(b.out), C}};
      c.forward_streaming = {2 * C, 1};
      break;
    case BlockKind::relu:
    case BlockKind::gelu:
    case BlockKind::tanh:
    case BlockKind::layernorm: c.forward_streaming = {2 * C, 1}; break;
  }
  return c;
}

double model_flops_per_row(const ModelSpec& m) {
  double f = 0;
  for (const BlockSpec& b : m.blocks) f += 3 * block_cost(b, {}, 0).forward_flops_per_row;
  return f;
}

double recomputed_flops_per_row(const ModelSpec& m) {
  double f = 0;
  for (const BlockSpec& b : m.blocks)
    if (b.recomputable) f += block_cost(b, {}, 0).forward_flops_per_row;
  return f;
}

double active_parameters(const ModelSpec& m) {
  std::set<std::string> seen;
  double n = 0;
  // An MTP block's decoder layers first (their experts k of E), then its own norms and eh_proj.
  const auto count = [&](const BlockSpec& b, const auto& self) -> void {
    for (const BlockSpec& in : b.inner) self(in, self);
    for (size_t j = 0; j < b.params.size(); ++j) {
      if (!seen.insert(b.params[j].name).second) continue;
      const double numel = double(shape_numel(b.params[j].shape));
      n += expert_of_param(b, j) >= 0 ? numel * double(b.moe.k) / double(b.moe.n_experts) : numel;
    }
  };
  for (const BlockSpec& b : m.blocks) count(b, count);
  return n;
}

}  // namespace relay
