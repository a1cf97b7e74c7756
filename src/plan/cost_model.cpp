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

struct Gemm { double M, N, K; };  // forward y (M, N) = x (M, K) @ w (K, N)

// The forward GEMMs of a block on one tp rank for `n` rows: dX is (n, K) = (n, N) @ (N, K), dW (K, N) = x^T dY.
std::vector<Gemm> block_gemms(const BlockSpec& b, double n, int tp) {
  const double C = double(b.in), t = double(tp);
  switch (b.kind) {
    case BlockKind::transformer:
      return {{n, 3 * C / t, C}, {n, C, C / t}, {n, 4 * C / t, C}, {n, C, 4 * C / t}};
    case BlockKind::llama_layer: {
      const double hd = C / double(b.n_head), Hq = double(b.n_head) * hd, Hkv = double(b.n_kv_head) * hd;
      const double F = double(b.ffn_hidden);
      return {{n, Hq / t, C}, {n, Hkv / t, C}, {n, Hkv / t, C}, {n, C, Hq / t},
              {n, F / t, C}, {n, F / t, C}, {n, C, F / t}};
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
Streaming streaming(const BlockSpec& b, int tp, int sp) {
  const double C = double(b.in), t = double(tp), s = double(sp);
  switch (b.kind) {
    case BlockKind::transformer:
      // ln_1 and ln_2 (read, write C each), the two residual adds (read 2C, write C each), the two
      // row-parallel biases (C each way): on rows / sp; the qkv bias (3C / tp each way), the fc bias and GELU
      // (4C / tp each way, twice).
      return {(2 * 2 + 2 * 3 + 2 * 2) * C / s + (2 * 3 + 4 * 4) * C / t, 12};
    case BlockKind::llama_layer: {
      const double hd = C / double(b.n_head), Hq = double(b.n_head) * hd, Hkv = double(b.n_kv_head) * hd;
      // two RMSNorms (2C each) and residual adds (3C each) on rows / sp; RoPE on q and k (read, write),
      // SwiGLU (read gate and up, write F).
      return {(2 * 2 + 2 * 3) * C / s + 2 * (Hq + Hkv) / t + 3 * double(b.ffn_hidden) / t, 9};
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
  for (const Gemm& g : block_gemms(b, n, ctx.tp)) {
    t.forward += gemm_s(d, p, g.M, g.N, g.K);
    t.backward_input += gemm_s(d, p, g.M, g.K, g.N);
    t.backward_weight += gemm_s(d, p, g.K, g.N, g.M);
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
  const Streaming s = streaming(b, ctx.tp, sp);
  const double elementwise = stream_s(d, e * s.elements_per_row * n) + s.kernels * d.kernel_launch_s;
  t.forward += elementwise;
  t.backward_input += 2 * elementwise;
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
    const double kv = 2 * e * n * ctx.cp * kv_heads * (double(b.in) / double(b.n_head)) / ctx.tp;
    t.comm_forward += all_gather_s(ctx.cp_path, kv);
    t.comm_backward += all_gather_s(ctx.cp_path, kv) + reduce_scatter_s(ctx.cp_path, kv);
  }
  t.forward += t.comm_forward;
  t.backward_input += t.comm_backward;
  if (ctx.recompute && b.recomputable) {
    t.backward_input += t.forward;
    t.comm_backward += t.comm_forward;
  }
  return t;
}

double optimizer_s(const Cluster::Device& d, double elements, bool mixed) {
  // AdamW reads master, gradient and two moments and writes master and moments (28 bytes), writes the working
  // copy (2, mixed precision), and the gradient norm and the zeroing of the gradients touch the gradients twice.
  return stream_s(d, elements * (28.0 + (mixed ? 2.0 : 0.0) + 8.0)) + 6 * d.kernel_launch_s;
}

}  // namespace relay
