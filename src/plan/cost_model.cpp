#include "plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"

namespace relay {

double stream_s(const Cluster::Device& d, double bytes) {
  return bytes / (d.memory_bandwidth * d.memory_efficiency);
}

double gemm_s(const Cluster::Device& d, Precision p, double M, double N, double K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  // Operands in the working dtype, or (fp8) one byte, the output in the working dtype.
  const double e = double(dtype_size(compute_dtype(p))), in = p == Precision::fp8 ? 1.0 : e;
  if (p == Precision::fp8 && d.gemm_peak(p) <= 0)
    throw Error("train.precision = \"fp8\": the cluster's device has no FP8 peak (device.peak_fp8_flops)");
  // cuBLAS's large-GEMM tiles are 128 x 256 (or 256 x 128) outputs per thread block, one block per SM at a time.
  const double tiles = std::ceil(M / 128.0) * std::ceil(N / 256.0);
  const double waves = std::ceil(tiles / d.sms), quantisation = tiles / (waves * d.sms);
  const double compute = 2.0 * M * N * K / (d.gemm_peak(p) * d.gemm_efficiency * quantisation);
  const double memory = stream_s(d, in * (M * K + K * N) + e * M * N);
  return std::max(compute, memory) + d.kernel_launch_s;
}

namespace {

// Seconds for one of the block's collectives over its dimension's group.
double collective_s(const BlockCollective& c, const BlockContext& ctx, double dtype_bytes) {
  const GroupPath& g = c.dim == ParallelDim::tp ? ctx.tp_path : c.dim == ParallelDim::cp ? ctx.cp_path : ctx.ep_path;
  const double bytes = c.buffer_bytes(dtype_bytes);
  // Under sequence parallelism a tp entry (an all-reduce's bytes) is run as an all-gather and a reduce-scatter: priced
  // as those two (a link's measured figures differ by collective; the alpha-beta ring gives their sum the all-reduce's).
  if (c.dim == ParallelDim::tp && ctx.sequence_parallel && c.op == CollectiveOp::all_reduce)
    return all_gather_s(g, bytes) + reduce_scatter_s(g, bytes);
  switch (c.op) {
    case CollectiveOp::all_reduce: return all_reduce_s(g, bytes);
    case CollectiveOp::all_gather: return all_gather_s(g, bytes);
    case CollectiveOp::reduce_scatter: return reduce_scatter_s(g, bytes);
    case CollectiveOp::all_to_all: return all_to_all_s(g, bytes);
  }
  return 0;
}

}  // namespace

BlockTime block_time(const Cluster::Device& d, const BlockSpec& b, const BlockContext& ctx) {
  BlockTime t;
  const double n = double(ctx.rows);
  const Precision p = ctx.precision;
  const int sp = ctx.sequence_parallel ? ctx.tp : 1;
  const BlockCost cost = block_cost(b, {ctx.tp, sp, ctx.cp, ctx.ep}, n);
  const double e = double(dtype_size(compute_dtype(p)));
  // train.precision = "fp8": a block whose linear layers run in FP8 (BlockSpec::fp8) runs its GEMMs at the FP8 rate,
  // each operand first quantised for that GEMM (model/fp8_linear.hpp): read in bf16 and written in FP8, tensorwise
  // after a pass of its own for the amax (5 bytes an element), blockwise in one (3). Other blocks' GEMMs in bf16.
  // The weight (K, N) is quantised for the forward and again for the input gradient of every micro-batch, unless its
  // codes are cached (ctx.fp8_weights_cached): then once an optimizer step (t.fp8_weights), for both.
  const Precision gp = p == Precision::fp8 && !b.fp8 ? Precision::bf16 : p;
  const double quantise = gp != Precision::fp8 ? 0 : *b.fp8 == Fp8Recipe::tensorwise ? 5.0 : 3.0;
  const double weight_quantise = ctx.fp8_weights_cached ? 0 : quantise;
  double experts_forward = 0, experts_backward = 0;  // seconds of the routed experts' GEMMs, for ep's overlap below
  for (size_t i = 0; i < cost.gemms.size(); ++i) {
    const Gemm& g = cost.gemms[i];
    const double f = g.count * (gemm_s(d, gp, g.M, g.N, g.K) +
                                stream_s(d, quantise * g.M * g.K + weight_quantise * g.K * g.N));
    const double bi = g.count * (gemm_s(d, gp, g.M, g.K, g.N) +
                                 stream_s(d, quantise * g.M * g.N + weight_quantise * g.N * g.K));
    if (ctx.fp8_weights_cached) t.fp8_weights += g.count * stream_s(d, quantise * g.K * g.N);
    t.forward += f;
    t.backward_input += bi;
    if (cost.routed_gemm > 0 && (i == cost.routed_gemm || i == cost.routed_gemm + 1))
      experts_forward += f, experts_backward += bi;
    t.backward_weight += g.count * (gemm_s(d, gp, g.K, g.N, g.M) + stream_s(d, quantise * (g.M * g.N + g.M * g.K)));
  }
  double attention_forward = 0, attention_backward = 0;  // seconds, for cp's overlap below
  if (cost.attention.on() && ctx.attention == PlannedAttention::flash) {
    // attention_flops_per_row is over the whole sequence (QK^T and att @ V, 4 T Hq); causal attention computes half,
    // and a cp rank's rows see on average half the sequence too (its chunks i and 2cp - 1 - i balance).
    const double flops = 0.5 * cost.attention_flops_per_row * n / ctx.tp;
    attention_forward = flops / (d.peak(p) * d.attention_forward_efficiency) + d.kernel_launch_s;
    attention_backward = 2.5 * flops / (d.peak(p) * d.attention_backward_efficiency) + d.kernel_launch_s;
    t.forward += attention_forward;
    t.backward_input += attention_backward;
  } else if (cost.attention.on()) {
    // PlannedAttention::materialised. attention_flops_per_row = 2 T Hq (hd + hd_v): a row's query meets T keys in each
    // of the Hq heads (hd_v: the value heads' width, hd but for MLA). The rank's (T, T) score matrices (one per
    // sequence and local head) priced as one GEMM of all their rows: M = their rows, so the scores' bytes are the
    // GEMM's output (QK^T) or input (att @ V).
    const double hd = double(cost.attention.head_dim), hdv = double(cost.attention.value_dim());
    const double T = cost.attention_flops_per_row / (2 * (hd + hdv) * double(cost.attention.heads));
    const double M = n * double(cost.attention.heads) / ctx.tp;  // score rows on the rank: (sequences x heads) x T
    const double scores = M * T;
    t.forward += gemm_s(d, p, M, T, hd) + gemm_s(d, p, M, hdv, T) +  // QK^T, att @ V
                 stream_s(d, scores * (4 * e + 1)) + 2 * d.kernel_launch_s;  // softmax (r, w), dropout (r, w, mask)
    // dV, dQ and dK; d(scores)
    t.backward_input += gemm_s(d, p, M, hdv, T) + 2 * gemm_s(d, p, M, hd, T) + gemm_s(d, p, M, T, hdv) +
                        stream_s(d, scores * (5 * e + 1)) + 2 * d.kernel_launch_s;  // dropout (r, mask, w), softmax (r r w)
  }
  const Streaming& s = cost.forward_streaming;
  const bool eager = ctx.elementwise == PlannedElementwise::eager;
  const double streamed = s.elements_per_row + (eager ? s.eager_extra_per_row : 0.0);
  const int kernels = s.kernels + (eager ? s.eager_extra_kernels : 0);
  const double elementwise = stream_s(d, e * streamed * n) + kernels * d.kernel_launch_s;
  t.forward += elementwise;
  t.backward_input += 2 * elementwise;
  const Streaming& w = cost.weight_streaming;
  if (w.kernels > 0) t.backward_weight += stream_s(d, e * w.elements_per_row * n) + w.kernels * d.kernel_launch_s;
  // The block's tp, cp and ep collectives, each dimension's summed on its own; ep's are also reported apart.
  double forward[3] = {0, 0, 0}, backward[3] = {0, 0, 0};  // by ParallelDim
  double cp_gather_forward = 0, cp_gather_backward = 0;       // of cp's: the key/value all-gathers
  double ep_rows_forward = 0, ep_rows_backward = 0;           // of ep's: the routed rows' all-to-alls (not the counts)
  for (const BlockCollective& c : cost.collectives) {
    const double s = c.count * collective_s(c, ctx, e);
    (c.backward ? backward : forward)[int(c.dim)] += s;
    if (c.dim == ParallelDim::cp && c.op == CollectiveOp::all_gather) (c.backward ? cp_gather_backward : cp_gather_forward) += s;
    if (c.dim == ParallelDim::ep && c.elements > 0) (c.backward ? ep_rows_backward : ep_rows_forward) += s;
  }
  double ef = 0, eb = 0;  // seconds of the forward's and the backward's ep all-to-alls hidden
  if (ctx.ep_overlap && ctx.ep > 1 && b.moe.n_experts / ctx.ep >= 2) {
    // With parallel.overlap a micro-batch's rows go in two parts, those of each rank's first half of its experts and
    // the rest's (balanced routing: half the rows each): part B's dispatch travels while part A's experts run, A's
    // return while B's run; A's dispatch and B's return stay exposed. With a = one all-to-all of the whole micro-batch
    // and X the routed experts' GEMMs, the pair costs max(2a, a + X) instead of 2a + X: min(a, X) hidden.
    ef = std::min(ep_rows_forward / 2, experts_forward);
    eb = std::min(ep_rows_backward / 2, experts_backward);
    forward[int(ParallelDim::ep)] -= ef;
    backward[int(ParallelDim::ep)] -= eb;
    t.ep_hidden = ef + eb;
  }
  // Tensor parallelism's asynchronous input-gradient all-reduce (parallel.overlap; model/tensor_parallel.hpp): each
  // travels while the weight gradients of the projections whose input gradient it sums are computed, so
  // min(all-reduce, those GEMMs) of it is hidden. Under sequence parallelism the entry is an all-gather and a
  // reduce-scatter; the reduce-scatter travels behind those weight gradients: min(reduce-scatter, those GEMMs).
  if (ctx.tp_overlap && ctx.tp > 1 && !ctx.split_backward)
    for (const BlockCollective& c : cost.collectives) {
      if (c.behind_weight_grads.empty()) continue;
      double weight_grads = 0;
      for (int i : c.behind_weight_grads) {
        const Gemm& g = cost.gemms[size_t(i)];
        weight_grads += g.count * gemm_s(d, gp, g.K, g.N, g.M);
      }
      const double comm =
          ctx.sequence_parallel ? reduce_scatter_s(ctx.tp_path, c.buffer_bytes(e)) : collective_s(c, ctx, e);
      const double hidden = c.count * std::min(comm, weight_grads);
      backward[int(ParallelDim::tp)] -= hidden;
      t.tp_hidden += hidden;
    }
  double tp_hidden_forward = 0;  // of t.tp_hidden, the forward's (again in a recomputed forward)
  // Sequence parallelism's collective matmul (parallel.overlap; GPT's c_attn and c_fc, Llama's q, k, v and gate, up,
  // not the experts', not in FP8): each forward
  // all-gather (priced as half its all-reduce entry: the other half is the reduce-scatter) travels in tp - 1 steps
  // behind the GEMM of the chunk in hand, so up to (tp - 1) / tp of the GEMM hides it.
  // The reduce-scatters after the row-parallel GEMMs (o_proj / c_proj, down / the MLP's c_proj) likewise: each
  // chunk's sum travels while the next chunk's partial is computed, up to (tp - 1) / tp of the GEMM.
  // The ring runs each of those GEMMs as tp GEMMs of n / tp rows: priced so (their tiles' waves, the weight read tp
  // times, tp launches), the difference from the one GEMM added to the forward.
  const bool rings = ctx.tp_overlap && ctx.sequence_parallel && ctx.tp > 1 && gp != Precision::fp8;
  // The ring's GEMMs gemms[idx] (forward: y (M, N) = x W; input_grad: dX (M, K) = dY W^T) as tp GEMMs of M / tp rows,
  // the difference from one GEMM added to `phase`; returns (tp - 1) / tp of them: what can hide the ring's messages.
  auto ring_gemms = [&](const std::vector<int>& idx, bool input_grad, double& phase) {
    double sum = 0;
    for (int i : idx) {
      const Gemm& g = cost.gemms[size_t(i)];
      const double N = input_grad ? g.K : g.N, K = input_grad ? g.N : g.K;
      const double chunked = g.count * ctx.tp * gemm_s(d, gp, g.M / ctx.tp, N, K);
      phase += chunked - g.count * gemm_s(d, gp, g.M, N, K);
      sum += chunked;
    }
    return sum * (ctx.tp - 1) / ctx.tp;
  };
  if (rings)
    for (const BlockCollective& c : cost.collectives) {
      auto forward_gemms = [&](const std::vector<int>& idx) { return ring_gemms(idx, false, t.forward); };
      double hidden = 0;
      if (!c.gather_feeds.empty())
        hidden += std::min(all_gather_s(ctx.tp_path, c.buffer_bytes(e)), forward_gemms(c.gather_feeds));
      if (!c.scatter_from.empty())
        hidden += std::min(reduce_scatter_s(ctx.tp_path, c.buffer_bytes(e)), forward_gemms(c.scatter_from));
      hidden *= c.count;
      forward[int(ParallelDim::tp)] -= hidden;
      tp_hidden_forward += hidden;
    }
  // And the backward's all-gathers (the output gradient's, d res1's) as collective matmuls behind the row-parallel
  // GEMMs' input gradients dX (M, K) = dY (M, N) W (N, K), chunked the same way (not under zb-h1's split either: B
  // runs them, the same code).
  if (rings)
    for (const BlockCollective& c : cost.collectives) {
      if (c.backward_gather_feeds.empty()) continue;
      const double gemms = ring_gemms(c.backward_gather_feeds, true, t.backward_input);
      const double hidden = c.count * std::min(all_gather_s(ctx.tp_path, c.buffer_bytes(e)), gemms);
      backward[int(ParallelDim::tp)] -= hidden;
      t.tp_hidden += hidden;
    }
  t.tp_hidden += tp_hidden_forward;
  double hf = 0, hb = 0;  // seconds of the forward's and the backward's cp gathers hidden
  if (ctx.overlap && ctx.cp > 1) {
    // With parallel.overlap each gather travels while the queries attend to the rank's own rows: of a rank's causal
    // attention work (chunks i and 2cp - 1 - i, 2cp c^2 score entries of c-row chunks) its own keys hold 2 c^2, 1/cp
    // of it on every rank. What of a gather that part does not cover stays exposed; the gradients' reduce-scatter
    // too (Relay waits for it before the block's backward returns).
    hf = std::min(cp_gather_forward, attention_forward / ctx.cp);
    hb = std::min(cp_gather_backward, attention_backward / ctx.cp);
    forward[int(ParallelDim::cp)] -= hf;
    backward[int(ParallelDim::cp)] -= hb;
    t.cp_hidden = hf + hb;
  }
  // What hiding costs the compute (Link::overlap_compute_share, measured by --calibrate): each second of a collective
  // hidden behind the block's work takes that share of a second from it (the progress thread and the transport's CPU
  // work on the cores the compute runs on). 0 on the presets.
  const double tp_hidden_backward = t.tp_hidden - tp_hidden_forward;
  t.forward += ctx.tp_path.compute_share * tp_hidden_forward + ctx.cp_path.compute_share * hf +
               ctx.ep_path.compute_share * ef;
  t.backward_input += ctx.tp_path.compute_share * tp_hidden_backward + ctx.cp_path.compute_share * hb +
                      ctx.ep_path.compute_share * eb;
  const int tp = int(ParallelDim::tp), cp = int(ParallelDim::cp), ep = int(ParallelDim::ep);
  t.comm_forward = forward[tp] + forward[cp] + forward[ep];
  t.comm_backward = backward[tp] + backward[cp] + backward[ep];
  t.ep_forward = forward[ep];
  t.ep_backward = backward[ep];
  t.forward += t.comm_forward;
  t.backward_input += t.comm_backward;
  if (ctx.recompute && b.recomputable) {
    t.backward_input += t.forward;
    t.comm_backward += t.comm_forward;
    t.ep_backward += t.ep_forward;
    t.cp_hidden += hf;
    t.ep_hidden += ef;
    t.tp_hidden += tp_hidden_forward;
  }
  return t;
}

double optimizer_s(const Cluster::Device& d, double elements, bool mixed) {
  // AdamW reads master, gradient and two moments and writes master and moments (28 bytes), writes the working
  // copy (2, mixed precision), and the gradient norm and the zeroing of the gradients touch the gradients twice.
  return stream_s(d, elements * (28.0 + (mixed ? 2.0 : 0.0) + 8.0)) + 6 * d.kernel_launch_s;
}

}  // namespace relay
