// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance, eps inside the sqrt), on
// float or bf16 storage. Row statistics are accumulated in double so the reference is tighter than any
// GPU kernel it checks (in SIMD lanes, then the lanes summed: the order depends on the CPU's vector
// width, fixed for a machine); mean and rstd are saved in float.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X>
RELAY_CPU_CLONES
void layernorm_forward(const X* x, const X* gamma, const X* beta, float eps, X* y, float* mean, float* rstd,
                       int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const X* xr = x + r * d;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += load(xr[i]);
    double mu = s / double(d);
    double v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t i = 0; i < d; ++i) v += (load(xr[i]) - mu) * (load(xr[i]) - mu);
    double rs = 1.0 / std::sqrt(v / double(d) + double(eps));
    mean[r] = float(mu);
    rstd[r] = float(rs);
    X* yr = y + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) store(yr[i], float((load(xr[i]) - mu) * rs) * load(gamma[i]) + load(beta[i]));
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), where g = dy * gamma.
template <typename X>
RELAY_CPU_CLONES
void layernorm_backward_input(const X* dy, const X* x, const X* gamma, const float* mean, const float* rstd, X* dx,
                              int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const X* xr = x + r * d;
    const X* dyr = dy + r * d;
    double mu = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t i = 0; i < d; ++i) {
      double g = double(load(dyr[i])) * load(gamma[i]);
      sg += g;
      sgx += g * (load(xr[i]) - mu) * rs;
    }
    sg /= double(d);
    sgx /= double(d);
    X* dxr = dx + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) {
      double g = double(load(dyr[i])) * load(gamma[i]);
      double xhat = (load(xr[i]) - mu) * rs;
      store(dxr[i], float(rs * (g - sg - xhat * sgx)));
    }
  }
}

// Column blocks in parallel, rows in order within each (deterministic, and row-major reads).
template <typename X>
RELAY_CPU_CLONES
void layernorm_backward_weight(const X* dy, const X* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t rows, int64_t d) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t c0 = bi * kBlock, c1 = std::min(d, c0 + kBlock);
    double sgm[kBlock] = {}, sb[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const double mu = mean[r], rs = rstd[r];
      for (int64_t i = c0; i < c1; ++i) {
        const double g = load(dy[r * d + i]);
        sgm[i - c0] += g * ((double(load(x[r * d + i])) - mu) * rs);
        sb[i - c0] += g;
      }
    }
    for (int64_t i = c0; i < c1; ++i) {
      dgamma[i] += float(sgm[i - c0]);
      dbeta[i] += float(sb[i - c0]);
    }
  }
}

#define INST(X)                                                                                                  \
  template void layernorm_forward<X>(const X*, const X*, const X*, float, X*, float*, float*, int64_t, int64_t); \
  template void layernorm_backward_input<X>(const X*, const X*, const X*, const float*, const float*, X*, int64_t, \
                                            int64_t);                                                            \
  template void layernorm_backward_weight<X>(const X*, const X*, const float*, const float*, float*, float*,     \
                                             int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
