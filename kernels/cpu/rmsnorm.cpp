// RMSNorm over the last dimension, as transformers' LlamaRMSNorm and torch.nn.RMSNorm (weight only, eps
// inside the sqrt), on float or bf16 storage. The row's mean square is accumulated in double like the
// LayerNorm kernels (layernorm.cpp), so the reference is tighter than the GPU kernels it checks; rstd is
// saved in float for the backward.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

constexpr int64_t kNormLanes = 8;  // a row's sums: simd.hpp's lane_sum

// Rows in blocks of kRowBlock: the block's sums first, then its reciprocal square roots together (they vectorise
// across the rows; one a row, a chain of a divide and a square root, was a third of the forward's time), then the
// rows' elementwise passes.
constexpr int64_t kRowBlock = 16;

template <typename X>
RELAY_CPU_CLONES
void rmsnorm_forward(const X* x, const X* gamma, float eps, X* y, float* rstd, int64_t rows, int64_t d) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (rows * d > kParallelElems)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t r0 = bi * kRowBlock, nr = std::min(kRowBlock, rows - r0);
    double rs[kRowBlock];
    for (int64_t j = 0; j < nr; ++j) {
      const X* xr = x + (r0 + j) * d;
      rs[j] = lane_sum<kNormLanes>(d, [&](int64_t i) { return double(load(xr[i])) * double(load(xr[i])); });
    }
    for (int64_t j = 0; j < nr; ++j) rs[j] = 1.0 / std::sqrt(rs[j] / double(d) + double(eps));
    for (int64_t j = 0; j < nr; ++j) {
      const X* xr = x + (r0 + j) * d;
      X* yr = y + (r0 + j) * d;
      rstd[r0 + j] = float(rs[j]);
      for (int64_t i = 0; i < d; ++i) store(yr[i], float(load(xr[i]) * rs[j]) * load(gamma[i]));
    }
  }
}

// y = x r g with r = (mean(x^2) + eps)^-1/2: dx = r (g dy) - x r^3 mean(g dy x).
template <typename X>
RELAY_CPU_CLONES
void rmsnorm_backward_input(const X* dy, const X* x, const X* gamma, const float* rstd, X* dx, int64_t rows,
                            int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const X* xr = x + r * d;
    const X* dyr = dy + r * d;
    const double rs = rstd[r];
    const double sgx =
        lane_sum<kNormLanes>(d, [&](int64_t i) { return double(load(dyr[i])) * load(gamma[i]) * load(xr[i]); });
    const double c = sgx / double(d) * rs * rs * rs;
    X* dxr = dx + r * d;
    for (int64_t i = 0; i < d; ++i)
      store(dxr[i], float(rs * (double(load(dyr[i])) * load(gamma[i])) - double(load(xr[i])) * c));
  }
}

// Column blocks in parallel, rows in order within each (deterministic, and row-major reads). A column's sum is the
// same whatever block holds it, so the block width is free: up to 64 columns, narrower (down to 16) so that every
// thread has a block where d is small (a 64-wide model's norms, MLA's 48- and 32-wide low-rank norms were one block,
// summed on one thread).
template <typename X>
RELAY_CPU_CLONES
void rmsnorm_backward_weight(const X* dy, const X* x, const float* rstd, float* dgamma, int64_t rows, int64_t d) {
  constexpr int64_t kBlock = 64, kMinBlock = 16;
  const bool parallel = rows * d > kParallelElems;
  const int64_t share = (d + threads() - 1) / threads();  // columns a thread, rounded up to kMinBlock below
  const int64_t width = parallel ? std::clamp((share + kMinBlock - 1) / kMinBlock * kMinBlock, kMinBlock, kBlock)
                                 : kBlock;
  const int64_t blocks = (d + width - 1) / width;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t c0 = bi * width, c1 = std::min(d, c0 + width);
    double sg[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const double rs = rstd[r];
      for (int64_t i = c0; i < c1; ++i) sg[i - c0] += double(load(dy[r * d + i])) * (double(load(x[r * d + i])) * rs);
    }
    for (int64_t i = c0; i < c1; ++i) dgamma[i] += float(sg[i - c0]);
  }
}

#define INST(X)                                                                                             \
  template void rmsnorm_forward<X>(const X*, const X*, float, X*, float*, int64_t, int64_t);                \
  template void rmsnorm_backward_input<X>(const X*, const X*, const X*, const float*, X*, int64_t, int64_t); \
  template void rmsnorm_backward_weight<X>(const X*, const X*, const float*, float*, int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
