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
// std::erf and std::exp are scalar calls in glibc unless -ffast-math, so GELU would cost as much as a
// GEMM; these float approximations vectorise under `omp simd` and stay within 5e-7 of the exact values.
namespace {
// erf(x) for float: odd rational approximation x P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 to float
// precision beyond); maximum absolute error 4.2e-7 over the reals (tests/test_cpu_kernels.cpp).
inline float erf_approx(float x) {
  float xc = x < -4.f ? -4.f : (x > 4.f ? 4.f : x);
  float x2 = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return xc * p / q;
}
// exp(x) for x <= 0 (the Gaussian density): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-6
// Taylor polynomial (relative error < 2e-7), 2^n assembled in the exponent bits.
inline float exp_neg_approx(float x) {
  x = x < -87.f ? -87.f : x;
  float t = x * 1.44269504088896341f + 0.5f;
  float n = static_cast<float>(static_cast<int32_t>(t));  // truncation vectorises on SSE2, floorf does not
  n = n > t ? n - 1.f : n;
  float r = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
  float e = 1.f / 720.f;
  e = e * r + 1.f / 120.f;
  e = e * r + 1.f / 24.f;
  e = e * r + 1.f / 6.f;
  e = e * r + 0.5f;
  e = e * r + 1.f;
  e = e * r + 1.f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return e * scale;
}
}  // namespace

void gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + erf_approx(x[i] * 0.70710678118654752f));
}
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float cdf = 0.5f * (1.f + erf_approx(x[i] * 0.70710678118654752f));
    float pdf = 0.39894228040143268f * exp_neg_approx(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}
// GPT-2's GELU, torch.nn.GELU(approximate="tanh"): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|), vectorisable through exp_neg_approx.
namespace {
inline float tanh_approx(float u) {
  const float e = exp_neg_approx(-2.f * (u < 0.f ? -u : u));
  const float t = (1.f - e) / (1.f + e);
  return u < 0.f ? -t : t;
}
constexpr float kGeluK = 0.79788456080286536f;  // sqrt(2 / pi)
}  // namespace
void gelu_tanh_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.f + tanh_approx(kGeluK * (v + 0.044715f * v * v * v)));
  }
}
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_approx(kGeluK * (v + 0.044715f * v * v * v));
    const float du = kGeluK * (1.f + 3.f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * du);
  }
}
void add(const float* a, const float* b, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
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
