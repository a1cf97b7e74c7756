// Optimizer updates with torch.optim's exact formulas (AdamW: decoupled decay, bias correction;
// SGD: momentum buffer initialised to the first gradient, dampening 0, no Nesterov), on f32 masters.
// Mixed precision: when work is given, the updated parameter is also rounded into its bf16 working copy
// in the same pass (llm.c's adamw kernel writes both), so no separate cast pass reads the masters.
#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

namespace {
// AdamW's constants for one step, from torch.optim.AdamW's formulas.
struct AdamWConsts {
  float b1, omb1, b2, omb2, step_size, bc2_sqrt, epsf, decay;
  AdamWConsts(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
    const double bc1 = 1.0 - std::pow(beta1, double(step));
    const double bc2 = 1.0 - std::pow(beta2, double(step));
    b1 = float(beta1), omb1 = float(1.0 - beta1), b2 = float(beta2), omb2 = float(1.0 - beta2);
    step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2)), epsf = float(eps);
    decay = float(1.0 - lr * weight_decay);
  }
};

// Element i's update: the one statement of AdamW's arithmetic that both loops below vectorise.
template <bool kWork>
inline void adamw_elem(float* p, const float* g, float* m, float* v, bf16* work, int64_t i, const AdamWConsts& c) {
  const float pi = p[i] * c.decay;
  const float mi = c.b1 * m[i] + c.omb1 * g[i];
  const float vi = c.b2 * v[i] + c.omb2 * g[i] * g[i];
  m[i] = mi;
  v[i] = vi;
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.epsf;
  const float pn = pi - c.step_size * (mi / denom);
  p[i] = pn;
  if constexpr (kWork) work[i] = f32_to_bf16(pn);
}

// One AdamW pass over [0, n); kWork: also round each updated parameter into work (a separate
// instantiation, so that neither loop tests for it per element and both vectorise).
template <bool kWork>
inline void adamw_loop(float* p, const float* g, float* m, float* v, bf16* work, int64_t n, const AdamWConsts& c) {
#pragma omp parallel for simd schedule(static) if (n > 8192)
  for (int64_t i = 0; i < n; ++i) adamw_elem<kWork>(p, g, m, v, work, i, c);
}
// Elements [lo, hi) of one tensor, on the calling thread.
template <bool kWork>
inline void adamw_range(const AdamWTensor& t, int64_t lo, int64_t hi, const AdamWConsts& c) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) adamw_elem<kWork>(t.p, t.g, t.m, t.v, t.work, i, c);
}
template <bool kWork>
inline void sgd_loop(float* p, const float* g, float* buf, bf16* work, int64_t n, float lrf, float mom, float wd,
                     bool first_step) {
#pragma omp parallel for simd schedule(static) if (n > 8192)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + wd * p[i];
    if (mom != 0.f) {
      buf[i] = first_step ? d : mom * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lrf * d;
    if constexpr (kWork) work[i] = f32_to_bf16(p[i]);
  }
}
}  // namespace

RELAY_CPU_CLONES
void adamw_step(float* p, const float* g, float* m, float* v, bf16* work, int64_t n, double lr,
                                 double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  const AdamWConsts c(lr, beta1, beta2, eps, weight_decay, step);
  if (work)
    adamw_loop<true>(p, g, m, v, work, n, c);
  else
    adamw_loop<false>(p, g, m, v, work, n, c);
}

// Every tensor's elements as one index space cut into one contiguous range a thread: a mixture of experts' many
// small matrices (each under the one-tensor loop's threshold, so each stepped on one thread) use every thread, and
// there is one parallel region a step instead of one a tensor.
RELAY_CPU_CLONES
void adamw_step_many(const AdamWTensor* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step) {
  const AdamWConsts c(lr, beta1, beta2, eps, weight_decay, step);
  int64_t total = 0;
  for (int64_t k = 0; k < count; ++k) total += ts[k].n;
#pragma omp parallel if (total > kParallelElems)
  {
    int nth = 1, tid = 0;
#ifdef _OPENMP
    nth = omp_get_num_threads(), tid = omp_get_thread_num();
#endif
    const int64_t lo = total * tid / nth, hi = total * (tid + 1) / nth;
    int64_t start = 0;  // the first element of tensor k in the index space
    for (int64_t k = 0; k < count && start < hi; start += ts[k].n, ++k) {
      const int64_t a = std::max(lo, start) - start, b = std::min(hi, start + ts[k].n) - start;
      if (a >= b) continue;
      if (ts[k].work)
        adamw_range<true>(ts[k], a, b, c);
      else
        adamw_range<false>(ts[k], a, b, c);
    }
  }
}

RELAY_CPU_CLONES void sgd_step(float* p, const float* g, float* buf, bf16* work, int64_t n, double lr,
                               double momentum, double weight_decay, bool first_step) {
  const float lrf = float(lr), mom = float(momentum), wd = float(weight_decay);
  if (work)
    sgd_loop<true>(p, g, buf, work, n, lrf, mom, wd, first_step);
  else
    sgd_loop<false>(p, g, buf, work, n, lrf, mom, wd, first_step);
}

}  // namespace relay::cpu
