// Vectorisable float approximations of exp, erf and tanh for the CPU kernels: std::exp and std::erf
// are scalar calls in glibc unless -ffast-math, so a GELU or a softmax over a vocabulary would cost as
// much as a GEMM. Accuracy is stated per function and checked in tests/test_cpu_kernels.cpp.
// Written without branches (min/max/copysign and selects) so that loops calling them vectorise.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace relay::cpu {

// erf(x) for float: odd rational approximation x P(x^2) / Q(x^2) on [-4, 4] (erf is +-1 to float
// precision beyond); maximum absolute error 4.2e-7 over the reals.
inline float erf_approx(float x) {
  const float xc = std::min(std::max(x, -4.f), 4.f);
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

// exp(x) for x <= 0 (softmax terms, the Gaussian density): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its
// degree-6 Taylor polynomial (relative error < 2e-7), 2^n assembled in the exponent bits; arguments below -87 give exp(-87) (~1.6e-38).
inline float exp_neg_approx(float x) {
  x = std::max(x, -87.f);
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

// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|).
inline float tanh_approx(float u) {
  const float e = exp_neg_approx(-2.f * std::fabs(u));
  return std::copysign((1.f - e) / (1.f + e), u);
}

}  // namespace relay::cpu
