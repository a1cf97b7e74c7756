// Mixture-of-experts kernels on float or bf16 storage (float math, float32 probabilities and weights), the same
// semantics as kernels/cpu/moe.cpp, bit for bit where the CPU's order can be kept:
//   router forward:  one warp per token row; softmax (the sum in double, as the CPU), then k selection passes, each a
//                    warp argmax of p + bias over the experts not yet taken (the lower expert on a tie), then the
//                    weights renormalised in j order by lane 0.
//   router backward: one warp per token row; dp from the weights' gradient and seq_grad, through the softmax with one
//                    warp sum (sum_e g[e] p[e], in a fixed order); the z-loss term 2 z_scale lse p.
//   combine:         one thread per output element, summing its k rows in j order (no reduction across threads).
//   combine backward: one block per (token, j): drows = w dy (plain writes), dweights = dy . rows (a block sum).
// Products the CPU rounds before an add are rounded here too (__fmul_rn, __fadd_rn, __fdiv_rn keep nvcc from fusing
// them into an FMA), so the experts chosen from the same probabilities are the CPU's.
#include "kernels/cuda/moe.cuh"

#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/router_select.cuh"

namespace relay::cuda {

namespace {
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kBlock / kWarp;  // router kernels: one warp per token row

unsigned router_grid(int64_t n) { return grid_rows((n + kRowsPerBlock - 1) / kRowsPerBlock); }
}  // namespace

// kernels ---------------------------------------------------------------------------------------

// grid (ceil(n / kRowsPerBlock)), block (kBlock): warp w of block b routes token row b * kRowsPerBlock + w.
template <typename X>
__global__ void moe_router_forward_kernel(const X* logits, float* probs, float* lse, int32_t* experts, float* weights,
                                          int64_t n, int64_t E, int64_t k, bool renormalize, const float* bias) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (t >= n) return;  // t is the same for the whole warp: no lane of a working warp leaves
  const X* z = logits + t * E;  // (E)
  float* p = probs + t * E;     // (E); lane l owns experts l, l + 32, ...: it reads back only what it wrote
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += kWarp) mx = fmaxf(mx, load(z[e]));
  mx = warp_max(mx);
  double sum = 0.0;  // as the CPU: float exponentials summed in double
  for (int64_t e = lane; e < E; e += kWarp) {
    const float q = expf(load(z[e]) - mx);
    p[e] = q;
    sum += q;
  }
  sum = warp_sum(sum);
  const float inv = float(1.0 / sum);
  for (int64_t e = lane; e < E; e += kWarp) p[e] = __fmul_rn(p[e], inv);
  if (lane == 0) lse[t] = mx + float(log(sum));

  // Top k by selection, as the CPU: k passes, each taking the first largest score among the experts not yet taken.
  uint64_t taken = 0;  // bit i: expert lane + 32 i is taken (E <= kMoeMaxExperts)
  int32_t* ex = experts + t * k;  // (k)
  float* w = weights + t * k;     // (k)
  float top = 0.0f;               // the chosen probabilities' sum, in j order (every lane holds it)
  for (int64_t j = 0; j < k; ++j) {
    float best_s = -INFINITY, best_p = 0.0f;
    int best_e = INT_MAX;
    int i = 0;
    for (int64_t e = lane; e < E; e += kWarp, ++i) {
      if ((taken >> i) & 1u) continue;
      const float pe = p[e];
      float s = bias ? __fadd_rn(pe, bias[e]) : pe;
      if (isnan(s)) s = -INFINITY;  // a NaN would break the order; the CPU's scan keeps a NaN it meets first
      if (chosen_before(s, int(e), best_s, best_e)) {
        best_s = s;
        best_e = int(e);
        best_p = pe;
      }
    }
    warp_best(best_s, best_e, best_p);
    if (best_e % kWarp == lane) taken |= uint64_t(1) << (best_e / kWarp);
    top += best_p;
    if (lane == 0) {
      ex[j] = best_e;
      w[j] = best_p;
    }
  }
  if (renormalize && lane == 0)
    for (int64_t j = 0; j < k; ++j) w[j] = __fdiv_rn(w[j], top);
}

// grid (ceil(n / kRowsPerBlock)), block (kBlock): warp w of block b differentiates token row b * kRowsPerBlock + w.
// Every lane computes the row's top-k sums S and dot itself, in j order (the same values in every lane).
template <typename X>
__global__ void moe_router_backward_kernel(const float* probs, const float* lse, const int32_t* experts,
                                           const float* dweights, bool renormalize, const float* seq_grad, int64_t T,
                                           float z_scale, X* dlogits, int64_t n, int64_t E, int64_t k) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (t >= n) return;
  const float* p = probs + t * E;                                 // (E)
  const int32_t* ex = experts + t * k;                            // (k)
  const float* dw = dweights + t * k;                             // (k)
  const float* sg = seq_grad ? seq_grad + (t / T) * E : nullptr;  // (E), constant over the row's sequence
  // weights[j] = p[ex[j]] / S when renormalising: dp[ex[j]] = (dw[j] - sum_l dw[l] w[l]) / S.
  float S = 0.0f, dot = 0.0f;
  for (int64_t j = 0; j < k; ++j) S += p[ex[j]];
  for (int64_t j = 0; j < k; ++j) dot += __fdiv_rn(__fmul_rn(dw[j], p[ex[j]]), S);
  // d loss / d p[e]: seq_grad's term, then each j choosing e, in j order (as the CPU's accumulation into g).
  auto grad = [&](int64_t e) {
    float g = sg ? sg[e] : 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (ex[j] == e) g = __fadd_rn(g, renormalize ? __fdiv_rn(__fsub_rn(dw[j], dot), S) : dw[j]);
    return g;
  };
  // Through the softmax: dz[e] = p[e] (g[e] - sum_i g[i] p[i]); the z-loss adds 2 z_scale lse p[e].
  float gp = 0.0f;
  for (int64_t e = lane; e < E; e += kWarp) gp += grad(e) * p[e];
  gp = warp_sum(gp);
  const float zl = 2.0f * z_scale * lse[t];
  X* dz = dlogits + t * E;  // (E)
  for (int64_t e = lane; e < E; e += kWarp) store(dz[e], __fmul_rn(p[e], __fadd_rn(__fsub_rn(grad(e), gp), zl)));
}

// grid-stride over the n * C outputs; each sums its k rows in j order.
template <typename X>
__global__ void moe_combine_kernel(const X* rows, const int32_t* pos, const float* weights, X* y, int64_t n, int64_t k,
                                   int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights ? weights[t * k + j] : 1.0f;
      s += w * load(rows[int64_t(pos[t * k + j]) * C + c]);
    }
    store(y[i], s);
  }
}

// grid (n * k), block (kBlock): block t * k + j writes row pos[t, j] of drows and dweights[t, j].
template <typename X>
__global__ void moe_combine_backward_kernel(const X* dy, const X* rows, const int32_t* pos, const float* weights,
                                            X* drows, float* dweights, int64_t k, int64_t C) {
  const int64_t tj = blockIdx.x;  // t * k + j
  const int64_t t = tj / k, r = pos[tj];
  const float w = weights[tj];
  const X* g = dy + t * C;    // (C)
  const X* x = rows + r * C;  // (C)
  X* d = drows + r * C;       // (C)
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = load(g[c]);
    dot += gc * load(x[c]);
    store(d[c], w * gc);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dweights[tj] = dot;
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void moe_router_forward(const X* logits, float* probs, float* lse, int32_t* experts, float* weights, int64_t n,
                        int64_t E, int64_t k, bool renormalize, const float* bias, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && E >= 1 && k >= 1 && k <= E, "moe_router_forward: n " << n << ", E " << E << ", k " << k);
  RELAY_ASSERT(E <= kMoeMaxExperts, "moe_router_forward: E = " << E << " experts, above the CUDA router's limit of "
                                                               << kMoeMaxExperts);
  if (n == 0) return;
  RELAY_ASSERT(logits && probs && lse && experts && weights, "moe_router_forward: null pointer");
  moe_router_forward_kernel<X>
      <<<router_grid(n), kBlock, 0, stream>>>(logits, probs, lse, experts, weights, n, E, k, renormalize, bias);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void moe_router_backward(const float* probs, const float* lse, const int32_t* experts, const float* dweights,
                         bool renormalize, const float* seq_grad, int64_t T, float z_scale, X* dlogits, int64_t n,
                         int64_t E, int64_t k, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && E >= 1 && k >= 1 && k <= E, "moe_router_backward: n " << n << ", E " << E << ", k " << k);
  RELAY_ASSERT(!seq_grad || (T >= 1 && n % T == 0), "moe_router_backward: T " << T << " must divide n " << n);
  if (n == 0) return;
  RELAY_ASSERT(probs && lse && experts && dweights && dlogits, "moe_router_backward: null pointer");
  moe_router_backward_kernel<X><<<router_grid(n), kBlock, 0, stream>>>(probs, lse, experts, dweights, renormalize,
                                                                       seq_grad, T, z_scale, dlogits, n, E, k);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void moe_combine(const X* rows, const int32_t* pos, const float* weights, X* y, int64_t n, int64_t k, int64_t C,
                 cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && k >= 0 && C >= 0, "moe_combine: n " << n << ", k " << k << ", C " << C);
  if (n == 0 || C == 0) return;
  RELAY_ASSERT(y && (k == 0 || (rows && pos)), "moe_combine: null pointer");
  RELAY_ASSERT(static_cast<const void*>(y) != static_cast<const void*>(rows), "moe_combine: y aliases rows");
  moe_combine_kernel<X><<<grid_for(n * C), kBlock, 0, stream>>>(rows, pos, weights, y, n, k, C);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void moe_combine_backward(const X* dy, const X* rows, const int32_t* pos, const float* weights, X* drows,
                          float* dweights, int64_t n, int64_t k, int64_t C, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && k >= 0 && C >= 0, "moe_combine_backward: n " << n << ", k " << k << ", C " << C);
  if (n == 0 || k == 0) return;
  RELAY_ASSERT(dy && rows && pos && weights && drows && dweights, "moe_combine_backward: null pointer");
  moe_combine_backward_kernel<X><<<grid_rows(n * k), kBlock, 0, stream>>>(dy, rows, pos, weights, drows, dweights, k, C);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                                    \
  template void moe_router_forward<X>(const X*, float*, float*, int32_t*, float*, int64_t, int64_t, int64_t, bool,    \
                                      const float*, cudaStream_t);                                                 \
  template void moe_router_backward<X>(const float*, const float*, const int32_t*, const float*, bool, const float*,  \
                                       int64_t, float, X*, int64_t, int64_t, int64_t, cudaStream_t);               \
  template void moe_combine<X>(const X*, const int32_t*, const float*, X*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void moe_combine_backward<X>(const X*, const X*, const int32_t*, const float*, X*, float*, int64_t,       \
                                        int64_t, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
