// DeepSeek-V3's sigmoid, group-limited router on the GPU (arXiv:2412.19437 section 2.1.2), the same semantics as
// kernels/cpu/moe_group_router.cpp, bit for bit where the CPU's order can be kept:
//   forward:  one warp per token row, lane l owning experts l, l + 32, ...; probs = sigmoid (expf against the CPU's
//             std::exp: within an ulp, the same value for equal logits); each group's score is the sum of its two
//             best choice scores p + bias, found as the top two of the lanes' top twos (exact: a multiset's two largest
//             values do not depend on the order they are met in); the topk_group best groups by k selection passes
//             over the scores in shared memory (the lower group first on a tie, as the CPU's upward scan keeps its
//             first best); then k passes of a warp argmax over the kept groups' untaken experts (the lower expert
//             first on a tie), the weights renormalised and scaled in j order by lane 0.
//   backward: one warp per token row; the row's sums (the normalised scores' denominator and dot product, the chosen
//             scores' sum and dot product) in the CPU's order by every lane, then each lane its experts' gradients.
// Products the CPU rounds before an add are rounded here too (__fmul_rn, __fadd_rn, __fdiv_rn keep nvcc from fusing
// them into an FMA), as kernels/cuda/moe.cu does for the softmax router.
#include "kernels/cuda/moe_group_router.cuh"

#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/router_select.cuh"

namespace relay::cuda {

namespace {
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kBlock / kWarp;  // one warp per token row
constexpr unsigned kFullMask = 0xffffffffu;

unsigned router_grid(int64_t n) { return grid_rows((n + kRowsPerBlock - 1) / kRowsPerBlock); }

// kernels ---------------------------------------------------------------------------------------

// grid (ceil(n / kRowsPerBlock)), block (kBlock): warp w of block b routes token row b * kRowsPerBlock + w.
template <typename X>
__global__ void moe_group_router_forward_kernel(const X* logits, float* probs, int32_t* experts, float* weights,
                                                int64_t n, int64_t E, int64_t k, int64_t n_group, int64_t topk_group,
                                                bool renormalize, float scale, const float* bias) {
  __shared__ float group_score[kRowsPerBlock][kGroupRouterMaxGroups];  // (rows, n_group) each warp's row's groups
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  if (t >= n) return;  // t is the same for the whole warp: no lane of a working warp leaves (no __syncthreads below)
  const X* z = logits + t * E;  // (E)
  float* p = probs + t * E;     // (E); lane l writes experts l, l + 32, ...
  for (int64_t e = lane; e < E; e += kWarp) p[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-load(z[e]))));
  __syncwarp();  // the group scores below read other lanes' probabilities
  auto choice = [&](int64_t e) { return bias ? __fadd_rn(p[e], bias[e]) : p[e]; };  // the choice only

  const int64_t G = E / n_group;  // experts per group
  uint64_t keep = n_group == 64 ? ~uint64_t(0) : (uint64_t(1) << n_group) - 1;  // bit g: group g stays a candidate
  if (n_group != topk_group) {
    for (int64_t g = 0; g < n_group; ++g) {
      float a = -INFINITY, b = -INFINITY;  // this lane's best and second best of the group
      for (int64_t e = g * G + lane; e < (g + 1) * G; e += kWarp) {
        const float s = choice(e);
        if (s > a) b = a, a = s;
        else if (s > b) b = s;
      }
      for (int offset = kWarp / 2; offset > 0; offset >>= 1) {  // the top two of both lanes' top twos
        const float oa = __shfl_xor_sync(kFullMask, a, offset), ob = __shfl_xor_sync(kFullMask, b, offset);
        const float hi = fmaxf(a, oa), lo = fminf(a, oa);
        a = hi;
        b = fmaxf(lo, fmaxf(b, ob));
      }
      if (lane == 0) group_score[warp][g] = G > 1 ? __fadd_rn(a, b) : a;
    }
    __syncwarp();
    keep = 0;
    for (int64_t j = 0; j < topk_group; ++j) {  // every lane the same passes over the same scores
      int64_t best = -1;
      for (int64_t g = 0; g < n_group; ++g)
        if (!((keep >> g) & 1u) && (best < 0 || group_score[warp][g] > group_score[warp][best])) best = g;
      keep |= uint64_t(1) << best;
    }
  }

  // Top k of the kept groups' experts by selection: k passes, each taking the first largest choice score not taken.
  uint64_t taken = 0;             // bit i: expert lane + 32 i is taken (E <= kGroupRouterMaxExperts)
  int32_t* ex = experts + t * k;  // (k)
  float* w = weights + t * k;     // (k)
  float top = 0.0f;               // the chosen probabilities' sum, in j order (every lane holds it)
  for (int64_t j = 0; j < k; ++j) {
    float best_s = -INFINITY, best_p = 0.0f;
    int best_e = INT_MAX;
    int i = 0;
    for (int64_t e = lane; e < E; e += kWarp, ++i) {
      if (((taken >> i) & 1u) || !((keep >> (e / G)) & 1u)) continue;
      const float s = choice(e);
      if (chosen_before(s, int(e), best_s, best_e)) {
        best_s = s;
        best_e = int(e);
        best_p = p[e];
      }
    }
    warp_best(best_s, best_e, best_p);
    if (best_e % kWarp == lane) taken |= uint64_t(1) << (best_e / kWarp);
    top = __fadd_rn(top, best_p);
    if (lane == 0) {
      ex[j] = best_e;
      w[j] = best_p;
    }
  }
  if (lane == 0) {
    const float denom = renormalize ? __fadd_rn(top, 1e-20f) : 1.0f;
    for (int64_t j = 0; j < k; ++j) w[j] = __fmul_rn(__fdiv_rn(w[j], denom), scale);
  }
}

// grid (ceil(n / kRowsPerBlock)), block (kBlock): warp w of block b differentiates token row b * kRowsPerBlock + w.
template <typename X>
__global__ void moe_group_router_backward_kernel(const float* probs, const int32_t* experts, const float* dweights,
                                                 bool renormalize, float scale, const float* seq_grad, int64_t T,
                                                 X* dlogits, int64_t n, int64_t E, int64_t k) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (t >= n) return;
  const float* p = probs + t * E;                                 // (E)
  const int32_t* ex = experts + t * k;                            // (k)
  const float* dw = dweights + t * k;                             // (k)
  const float* dq = seq_grad ? seq_grad + (t / T) * E : nullptr;  // (E), constant over the row's sequence
  // q[e] = p[e] / D, D = sum_i p[i] + 1e-20: dp[e] = (dq[e] - sum_i dq[i] q[i]) / D. Every lane sums in e order.
  float D = 1e-20f, qdot = 0.0f;
  if (dq) {
    for (int64_t e = 0; e < E; ++e) D = __fadd_rn(D, p[e]);
    for (int64_t e = 0; e < E; ++e) qdot = __fadd_rn(qdot, __fmul_rn(dq[e], __fdiv_rn(p[e], D)));
  }
  // weights[j] = scale p[ex[j]] / S (S = the chosen sum + 1e-20 when renormalising):
  // dp[ex[j]] = scale (dw[j] - sum_l dw[l] p[ex[l]] / S) / S. Every lane sums in j order.
  float S = 1e-20f, wdot = 0.0f;
  if (renormalize) {
    for (int64_t j = 0; j < k; ++j) S = __fadd_rn(S, p[ex[j]]);
    for (int64_t j = 0; j < k; ++j) wdot = __fadd_rn(wdot, __fdiv_rn(__fmul_rn(dw[j], p[ex[j]]), S));
  }
  X* dz = dlogits + t * E;  // (E)
  for (int64_t e = lane; e < E; e += kWarp) {
    float g = dq ? __fdiv_rn(__fsub_rn(dq[e], qdot), D) : 0.0f;  // d loss / d p[e]
    for (int64_t j = 0; j < k; ++j)
      if (ex[j] == e)
        g = __fadd_rn(g, renormalize ? __fdiv_rn(__fmul_rn(scale, __fsub_rn(dw[j], wdot)), S) : __fmul_rn(scale, dw[j]));
    store(dz[e], __fmul_rn(__fmul_rn(g, p[e]), __fsub_rn(1.0f, p[e])));  // through the sigmoid: dp p (1 - p)
  }
}

}  // namespace

// launchers -------------------------------------------------------------------------------------

template <typename X>
void moe_group_router_forward(const X* logits, float* probs, int32_t* experts, float* weights, int64_t n, int64_t E,
                              int64_t k, int64_t n_group, int64_t topk_group, bool renormalize, float scale,
                              const float* bias, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && E >= 1 && E <= kGroupRouterMaxExperts && n_group >= 1 && n_group <= kGroupRouterMaxGroups &&
                   E % n_group == 0 && topk_group >= 1 && topk_group <= n_group && k >= 1 &&
                   k <= topk_group * (E / n_group),
               "moe_group_router_forward: n " << n << ", E " << E << ", k " << k << ", n_group " << n_group
                                              << ", topk_group " << topk_group);
  if (n == 0) return;
  RELAY_ASSERT(logits && probs && experts && weights, "moe_group_router_forward: null pointer");
  moe_group_router_forward_kernel<X><<<router_grid(n), kBlock, 0, stream>>>(logits, probs, experts, weights, n, E, k,
                                                                            n_group, topk_group, renormalize, scale,
                                                                            bias);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void moe_group_router_backward(const float* probs, const int32_t* experts, const float* dweights, bool renormalize,
                               float scale, const float* seq_grad, int64_t T, X* dlogits, int64_t n, int64_t E,
                               int64_t k, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && E >= 1 && k >= 1 && k <= E && (!seq_grad || (T >= 1 && n % T == 0)),
               "moe_group_router_backward: n " << n << ", E " << E << ", k " << k << ", T " << T);
  if (n == 0) return;
  RELAY_ASSERT(probs && experts && dweights && dlogits, "moe_group_router_backward: null pointer");
  moe_group_router_backward_kernel<X><<<router_grid(n), kBlock, 0, stream>>>(probs, experts, dweights, renormalize,
                                                                             scale, seq_grad, T, dlogits, n, E, k);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                                    \
  template void moe_group_router_forward<X>(const X*, float*, int32_t*, float*, int64_t, int64_t, int64_t, int64_t, \
                                            int64_t, bool, float, const float*, cudaStream_t);                     \
  template void moe_group_router_backward<X>(const float*, const int32_t*, const float*, bool, float, const float*, \
                                             int64_t, X*, int64_t, int64_t, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
