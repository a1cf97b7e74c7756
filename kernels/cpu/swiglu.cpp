// SwiGLU, the gated MLP activation of Llama (Shazeer, arXiv:2002.05202): h = silu(gate) * up, on float
// or bf16 storage with float math. The sigmoid uses exp_neg_approx (fast_math.hpp, relative error
// < 2e-7) on -|g| so that it never overflows and the loop vectorises.
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/fast_math.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

namespace {
// sigmoid(g) = 1 / (1 + e^-g), from e = e^-|g| <= 1: 1 / (1 + e) for g >= 0, e / (1 + e) below.
inline float sigmoid(float g) {
  const float e = exp_neg_approx(-std::fabs(g));
  return (g >= 0.f ? 1.f : e) / (1.f + e);
}
}  // namespace

template <typename X>
RELAY_CPU_CLONES void swiglu_forward(const X* gate, const X* up, X* h, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(gate[i]);
    store(h[i], g * sigmoid(g) * load(up[i]));
  }
}

// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). Each element's inputs are read before its outputs are
// written, so dgate and dup may alias dh, gate or up.
template <typename X>
RELAY_CPU_CLONES void swiglu_backward(const X* dh, const X* gate, const X* up, X* dgate, X* dup, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelElems)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(gate[i]), u = load(up[i]), d = load(dh[i]);
    const float s = sigmoid(g);
    store(dgate[i], d * u * (s * (1.f + g * (1.f - s))));
    store(dup[i], d * (g * s));
  }
}

#define INST(X)                                                               \
  template void swiglu_forward<X>(const X*, const X*, X*, int64_t); \
  template void swiglu_backward<X>(const X*, const X*, const X*, X*, X*, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
