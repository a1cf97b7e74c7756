#include "plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace relay {

double stream_s(const Cluster::Device& d, double bytes) {
  return bytes / (d.memory_bandwidth * d.memory_efficiency);
}

double gemm_s(const Cluster::Device& d, Precision p, double M, double N, double K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  const double e = double(dtype_size(compute_dtype(p)));
  // cuBLAS's large-GEMM tiles are 128 x 256 (or 256 x 128) outputs per thread block, one block per SM at a time.
  const double tiles = std::ceil(M / 128.0) * std::ceil(N / 256.0);
  const double waves = std::ceil(tiles / d.sms), quantisation = tiles / (waves * d.sms);
  const double compute = 2.0 * M * N * K / (d.peak(p) * d.gemm_efficiency * quantisation);
  const double memory = stream_s(d, e * (M * K + K * N + M * N));
  return std::max(compute, memory) + d.kernel_launch_s;
}

namespace {

struct Gemm { double M, N, K, count = 1; };  // `count` GEMMs y (M, N) = x (M, K) @ w (K, N) in the forward

// The forward GEMMs of a block on one tp rank for `n` rows: dX is (n, K) = (n, N) @ (N, K), dW (K, N) = x^T dY.
// A MoE layer's experts: E / ep on the rank, each on n k ep / E rows under balanced routing (model/moe.hpp groups the
// rows expert by expert and runs each expert's GEMMs on its block).
std::vector<Gemm> block_gemms(const BlockSpec& b, double n, int tp, int ep) {
  const double C = double(b.in), t = double(tp);
  switch (b.kind) {
    case BlockKind::transformer:
      return {{n, 3 * C / t, C}, {n, C, C / t}, {n, 4 * C / t, C}, {n, C, 4 * C / t}};
    case BlockKind::llama_layer: {
      const double hd = double(head_dim(b));
      const double Hq = double(b.n_head) * hd, Hkv = double(b.n_kv_head) * hd;
      std::vector<Gemm> g = {{n, Hq / t, C}, {n, Hkv / t, C}, {n, Hkv / t, C}, {n, C, Hq / t}};
      if (b.moe.on()) {  // tp splits each expert's units as the dense SwiGLU's; the router is whole on every tp rank
        const double E = double(b.moe.n_experts), F = double(b.moe.ffn_hidden) / t, local = E / ep;
        const double rows = n * double(b.moe.k) * ep / E;  // (rows, C) per local expert
        g.insert(g.end(), {{n, E, C}, {rows, F, C, 2 * local}, {rows, C, F, local}});
      } else {
        const double F = double(b.ffn_hidden);
        g.insert(g.end(), {{n, F / t, C}, {n, F / t, C}, {n, C, F / t}});
      }
      return g;
    }
    case BlockKind::head: return {{n, std::ceil(double(b.out) / t), C}};
    case BlockKind::linear: return {{n, double(b.out), double(b.in)}};
    default: return {};
  }
}

// Elements the block's memory-bound kernels read and write in the forward, per row, and their count;
// the backward moves about twice as much (each reads the forward's input and the output gradient and
// writes the input gradient, plus the bias and norm-weight reductions) in about twice the kernels.
struct Streaming { double elements_per_row = 0; int kernels = 0; };
Streaming streaming(const BlockSpec& b, int tp, int sp, int ep) {
  const double C = double(b.in), t = double(tp), s = double(sp);
  switch (b.kind) {
    case BlockKind::transformer:
      // ln_1 and ln_2 (read, write C each), the two residual adds (read 2C, write C each), the two
      // row-parallel biases (C each way): on rows / sp; the qkv bias (3C / tp each way), the fc bias and GELU
      // (4C / tp each way, twice).
      return {(2 * 2 + 2 * 3 + 2 * 2) * C / s + (2 * 3 + 4 * 4) * C / t, 12};
    case BlockKind::llama_layer: {
      const double hd = double(head_dim(b));
      const double Hq = double(b.n_head) * hd, Hkv = double(b.n_kv_head) * hd;
      // two RMSNorms (2C each) and residual adds (3C each) on rows / sp; RoPE on q and k (read, write),
      // SwiGLU (read gate and up, write F).
      const double attn = (2 * 2 + 2 * 3) * C / s + 2 * (Hq + Hkv) / t;
      if (!b.moe.on()) return {attn + 3 * double(b.ffn_hidden) / t, 9};
      // MoE: the router's softmax and top-k over E (read, write), the tokens' k rows gathered in expert order (k C
      // each way), SwiGLU over k F per token, the k outputs weighted and summed (read k C, write C); under ep the
      // rows regrouped between arrival and expert order on the way in and out (k C each way, twice).
      const double E = double(b.moe.n_experts), k = double(b.moe.k), F = double(b.moe.ffn_hidden) / t;
      return {attn + 2 * E + 2 * k * C + 3 * k * F + (k + 1) * C + (ep > 1 ? 4 * k * C : 0), ep > 1 ? 14 : 12};
    }
    case BlockKind::head:
      // the final norm, and the loss over the vocabulary shard: logits read, softmax and gradient written (f32).
      return {2 * C / s + 4.0 * std::ceil(double(b.out) / t), 4};
    case BlockKind::embedding: return {2 * C, 2};
    default: return {2 * C, 1};
  }
}

}  // namespace

BlockTime block_time(const Cluster::Device& d, const BlockSpec& b, const BlockContext& ctx) {
  BlockTime t;
  const double n = double(ctx.rows);
  const Precision p = ctx.precision;
  for (const Gemm& g : block_gemms(b, n, ctx.tp, ctx.ep)) {
    t.forward += g.count * gemm_s(d, p, g.M, g.N, g.K);
    t.backward_input += g.count * gemm_s(d, p, g.M, g.K, g.N);
    t.backward_weight += g.count * gemm_s(d, p, g.K, g.N, g.M);
  }
  const double e = double(dtype_size(compute_dtype(p)));
  const bool attention = b.kind == BlockKind::transformer || b.kind == BlockKind::llama_layer;
  if (attention) {
    // attn_flops is per row over the whole sequence (QK^T and att @ V, 4 T Hq); causal attention computes half,
    // and a cp rank's rows see on average half the sequence too (its chunks i and 2cp - 1 - i balance).
    const double flops = 0.5 * b.attn_flops * n / ctx.tp;
    t.forward += flops / (d.peak(p) * d.attention_forward_efficiency) + d.kernel_launch_s;
    t.backward_input += 2.5 * flops / (d.peak(p) * d.attention_backward_efficiency) + d.kernel_launch_s;
  }
  const int sp = ctx.sequence_parallel ? ctx.tp : 1;
  const Streaming s = streaming(b, ctx.tp, sp, ctx.ep);
  const double elementwise = stream_s(d, e * s.elements_per_row * n) + s.kernels * d.kernel_launch_s;
  t.forward += elementwise;
  t.backward_input += 2 * elementwise;
  // A dense Llama layer's backward_weight recomputes the SwiGLU output from the kept gate and up (read 2F, write F).
  if (b.kind == BlockKind::llama_layer && !b.moe.on())
    t.backward_weight += stream_s(d, e * 3.0 * double(b.ffn_hidden) / ctx.tp * n) + d.kernel_launch_s;
  // Tensor parallelism (Megatron-LM): a decoder block all-reduces its two row-parallel outputs in the forward and
  // its two column-parallel input gradients in the backward (under sequence parallelism an all-gather and a
  // reduce-scatter in their place: the same bytes); the vocabulary-parallel embedding sums its output, the head
  // its input gradient and the loss's row maxima and sums. On the critical path: Relay does not overlap them.
  const double act = e * n * double(b.in);  // one (rows, C) activation
  if (ctx.tp > 1) {
    if (attention) {
      t.comm_forward += 2 * all_reduce_s(ctx.tp_path, act);
      t.comm_backward += 2 * all_reduce_s(ctx.tp_path, act);
    } else if (b.kind == BlockKind::embedding) {
      t.comm_forward += all_reduce_s(ctx.tp_path, act);
    } else if (b.kind == BlockKind::head) {
      t.comm_forward += 2 * all_reduce_s(ctx.tp_path, 4 * n);
      t.comm_backward += all_reduce_s(ctx.tp_path, act);
    }
  }
  // Context parallelism (model/context_parallel.hpp): the forward all-gathers the micro-batch's keys and values over
  // the group, the backward gathers them again and reduce-scatters their gradients.
  if (attention && ctx.cp > 1) {
    const double kv_heads = b.kind == BlockKind::transformer ? double(b.n_head) : double(b.n_kv_head);
    const double hd = double(head_dim(b));
    const double kv = 2 * e * n * ctx.cp * kv_heads * hd / ctx.tp;
    t.comm_forward += all_gather_s(ctx.cp_path, kv);
    t.comm_backward += all_gather_s(ctx.cp_path, kv) + reduce_scatter_s(ctx.cp_path, kv);
  }
  // Expert parallelism (model/expert_parallel.hpp): the forward exchanges the row counts (E integers) and sends the
  // routed rows (n k of them, C elements each) to their experts' ranks and back; the backward sends the outputs'
  // gradients and returns the inputs'. Not overlapped: the next GEMM needs the rows.
  if (b.moe.on() && ctx.ep > 1) {
    const double rows = e * n * double(b.moe.k) * double(b.in);
    t.ep_forward = all_to_all_s(ctx.ep_path, 8.0 * double(b.moe.n_experts)) + 2 * all_to_all_s(ctx.ep_path, rows);
    t.ep_backward = 2 * all_to_all_s(ctx.ep_path, rows);
    t.comm_forward += t.ep_forward;
    t.comm_backward += t.ep_backward;
  }
  t.forward += t.comm_forward;
  t.backward_input += t.comm_backward;
  if (ctx.recompute && b.recomputable) {
    t.backward_input += t.forward;
    t.comm_backward += t.comm_forward;
    t.ep_backward += t.ep_forward;
  }
  return t;
}

double optimizer_s(const Cluster::Device& d, double elements, bool mixed) {
  // AdamW reads master, gradient and two moments and writes master and moments (28 bytes), writes the working
  // copy (2, mixed precision), and the gradient norm and the zeroing of the gradients touch the gradients twice.
  return stream_s(d, elements * (28.0 + (mixed ? 2.0 : 0.0) + 8.0)) + 6 * d.kernel_launch_s;
}

}  // namespace relay
