// Bias, activations, scaling and reductions. Reductions use fixed-size blocks summed in order, so the
// result is independent of the thread count.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, float beta) {
  // Column blocks in parallel; rows summed in order within each column (deterministic).
  constexpr int64_t kBlock = 64;
  int64_t blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t bi = 0; bi < blocks; ++bi) {
    int64_t c0 = bi * kBlock, c1 = std::min(cols, c0 + kBlock);
    float acc[kBlock];
    for (int64_t c = c0; c < c1; ++c) acc[c - c0] = 0.f;
    for (int64_t r = 0; r < rows; ++r) {
      const float* d = dy + r * cols;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += d[c];
    }
    for (int64_t c = c0; c < c1; ++c) db[c] = (beta == 0.f ? 0.f : beta * db[c]) + acc[c - c0];
  }
}

void relu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
void relu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.f ? dy[i] : 0.f;
}

// gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); gelu'(x) = Phi(x) + x * phi(x).
void gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * 0.70710678118654752f));
}
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float cdf = 0.5f * (1.f + std::erf(x[i] * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * std::exp(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}
void tanh_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
void tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float t = std::tanh(x[i]);
    dx[i] = dy[i] * (1.f - t * t);
  }
}

void scale(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
void fill(float* x, float v, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kBlock = 4096;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    double acc = 0;
    for (int64_t i = b * kBlock, e = std::min(n, (b + 1) * kBlock); i < e; ++i) acc += double(x[i]) * double(x[i]);
    partial[static_cast<size_t>(b)] = acc;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace relay::cpu
