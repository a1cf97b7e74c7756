// Conversions, bias, activations, scaling and reductions, on float or bf16 storage with float math.
// Reductions use fixed-size blocks summed in order, so the result is independent of the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/fast_math.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X, typename Y>
RELAY_CPU_CLONES void convert(const X* x, Y* y, int64_t n) {
  if constexpr (std::is_same_v<X, Y>) {
    if (static_cast<const void*>(x) != static_cast<const void*>(y)) std::memcpy(y, x, size_t(n) * sizeof(X));
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
    for (int64_t i = 0; i < n; ++i) store(y[i], load(x[i]));
  }
}
template void convert<float, float>(const float*, float*, int64_t);
template void convert<float, bf16>(const float*, bf16*, int64_t);
template void convert<bf16, float>(const bf16*, float*, int64_t);
template void convert<bf16, bf16>(const bf16*, bf16*, int64_t);

template <typename X>
RELAY_CPU_CLONES void add_bias(X* y, const X* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    X* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) store(yr[c], load(yr[c]) + load(bias[c]));
  }
}

template <typename X>
RELAY_CPU_CLONES void bias_grad(const X* dy, float* db, int64_t rows, int64_t cols, float beta) {
  // Column blocks in parallel; rows summed in order within each column (deterministic).
  constexpr int64_t kBlock = 64;
  int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    int64_t c0 = bi * kBlock, c1 = std::min(cols, c0 + kBlock);
    float acc[kBlock];
    for (int64_t c = c0; c < c1; ++c) acc[c - c0] = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      const X* d = dy + r * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += load(d[c]);
    }
    for (int64_t c = c0; c < c1; ++c) db[c] = (beta == 0.f ? 0.f : beta * db[c]) + acc[c - c0];
  }
}

template <typename X>
RELAY_CPU_CLONES void relu_forward(const X* x, X* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) store(y[i], load(x[i]) > 0.f ? load(x[i]) : 0.f);
}
template <typename X>
RELAY_CPU_CLONES void relu_backward(const X* x, const X* dy, X* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) store(dx[i], load(x[i]) > 0.f ? load(dy[i]) : 0.f);
}

// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); gelu'(x) = Phi(x) + x * phi(x); within 5e-7 of
// the exact values through fast_math.hpp's approximations.
template <typename X>
RELAY_CPU_CLONES void gelu_forward(const X* x, X* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load(x[i]);
    store(y[i], 0.5f * v * (1.f + erf_approx(v * 0.70710678118654752f)));
  }
}
template <typename X>
RELAY_CPU_CLONES void gelu_backward(const X* x, const X* dy, X* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load(x[i]);
    float cdf = 0.5f * (1.f + erf_approx(v * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * exp_neg_approx(-0.5f * v * v);
    store(dx[i], load(dy[i]) * (cdf + v * pdf));
  }
}
// GPT-2's GELU, torch.nn.GELU(approximate="tanh"): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
namespace {
constexpr float kGeluK = 0.79788456080286536f;  // sqrt(2 / pi)
}  // namespace
template <typename X>
RELAY_CPU_CLONES void gelu_tanh_forward(const X* x, X* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load(x[i]);
    store(y[i], 0.5f * v * (1.f + tanh_approx(kGeluK * (v + 0.044715f * v * v * v))));
  }
}
template <typename X>
RELAY_CPU_CLONES void gelu_tanh_backward(const X* x, const X* dy, X* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load(x[i]);
    const float t = tanh_approx(kGeluK * (v + 0.044715f * v * v * v));
    const float du = kGeluK * (1.f + 3.f * 0.044715f * v * v);
    store(dx[i], load(dy[i]) * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du));
  }
}
template <typename X>
RELAY_CPU_CLONES void add(const X* a, const X* b, X* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) store(y[i], load(a[i]) + load(b[i]));
}
template <typename X>
void tanh_forward(const X* x, X* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) store(y[i], std::tanh(load(x[i])));
}
template <typename X>
void tanh_backward(const X* x, const X* dy, X* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float t = std::tanh(load(x[i]));
    store(dx[i], load(dy[i]) * (1.f - t * t));
  }
}

template <typename X>
RELAY_CPU_CLONES void scale(X* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) store(x[i], load(x[i]) * s);
}
template <typename X>
void fill(X* x, float v, int64_t n) {
  X value;
  store(value, v);
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}
void fill_i32(int32_t* x, int32_t v, int64_t n) { std::fill(x, x + n, v); }

#define INST(X)                                                                 \
  template void fill<X>(X*, float, int64_t);                                    \
  template void add_bias<X>(X*, const X*, int64_t, int64_t);                    \
  template void bias_grad<X>(const X*, float*, int64_t, int64_t, float);        \
  template void relu_forward<X>(const X*, X*, int64_t);                         \
  template void relu_backward<X>(const X*, const X*, X*, int64_t);              \
  template void gelu_forward<X>(const X*, X*, int64_t);                         \
  template void gelu_backward<X>(const X*, const X*, X*, int64_t);              \
  template void gelu_tanh_forward<X>(const X*, X*, int64_t);                    \
  template void gelu_tanh_backward<X>(const X*, const X*, X*, int64_t);         \
  template void add<X>(const X*, const X*, X*, int64_t);                        \
  template void tanh_forward<X>(const X*, X*, int64_t);                         \
  template void tanh_backward<X>(const X*, const X*, X*, int64_t);              \
  template void scale<X>(X*, float, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

RELAY_CPU_CLONES double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n > kParallelElems)
  for (int64_t b = 0; b < blocks; ++b) {
    double acc = 0;
    const int64_t e = std::min(n, (b + 1) * kBlock);
#pragma omp simd reduction(+ : acc)
    for (int64_t i = b * kBlock; i < e; ++i) acc += double(x[i]) * double(x[i]);
    partial[static_cast<size_t>(b)] = acc;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace relay::cpu
