// Runtime ISA dispatch for the CPU kernels. The binary targets baseline x86-64 (SSE2) so that it runs on
// any x86-64; a kernel marked RELAY_CPU_CLONES is compiled three times (x86-64-v4: AVX-512; x86-64-v3:
// AVX2 + FMA; baseline) and the dynamic loader picks the best one for the CPU at start-up (GCC's
// target_clones, an ifunc). The code stays plain loops; the clones differ only in vector width and FMA
// use, so results may differ in the last bits between CPUs of different kinds, never between runs on one.
// Inline helpers (load/store, fast_math) are inlined into each clone and compiled for its ISA. OpenMP
// regions inside a cloned function are cloned with it.
//
// kernels/cpu is compiled with -fno-trapping-math and -fno-thread-jumps (CMakeLists.txt): without them GCC
// keeps the selects of fast_math.hpp and bf16 rounding as branches ("control flow in loop") and vectorises
// nothing. Neither changes a result: no code here reads floating-point exception flags.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#define RELAY_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RELAY_CPU_CLONES
#endif

// A helper of a cloned kernel that GCC would not inline by itself (a loop of some size, called per row): without
// this it is compiled once, for baseline SSE2, and every clone calls that one (cross_entropy's row passes ran at 3.5
// ns a logit so). Forced inline, it is compiled into each clone for the clone's ISA.
#if defined(__GNUC__) && !defined(__NVCC__)
#define RELAY_CPU_INLINE inline __attribute__((always_inline))
#else
#define RELAY_CPU_INLINE inline
#endif

#include <cstdint>

namespace relay::cpu {
// An elementwise loop worth an OpenMP parallel region: the fork and join cost ~1-2 us with the team's threads
// spinning (OMP_WAIT_POLICY active by default), 16384 bf16 elements of an add ~5 us on one core. Above 65536 the
// 64-wide models' residual adds (1024 rows x 64) and their experts' SwiGLU ran on one thread while the other spun.
inline constexpr int64_t kParallelElems = 16384;
// A router's loop over tokens, counted in scores (tokens x experts): each score costs an exp and k selection passes,
// about eight elementwise ops' work, so 2048 of them are worth a region. At kParallelElems a 64-wide model's router
// (1024 tokens x 8 experts = 8192 scores, with DeepSeek-V3's group ranking) ran on one thread while the other spun.
inline constexpr int64_t kParallelScores = kParallelElems / 8;

// A row's sum in Lanes double partial sums (lane l takes the columns i = l mod Lanes, each in column order), added in a
// fixed tree at the end: one order in every clone, whatever its vector width. OpenMP simd reductions spilled their
// vector lanes to the stack and added them one by one, per row, which cost more than the row's arithmetic at the
// widths of a 64-wide model and of MLA's low-rank norms. RMSNorm sums 8 lanes; the cross-entropy's exp sum 16, so
// that its float exps vectorise at full width (8 lanes cost it 13-28%).
// The tree folds the upper half of the lanes onto the lower until one is left (8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5)
// + (l3 + l7))).
template <int64_t Lanes>
RELAY_CPU_INLINE double lane_total(const double* l) {
  static_assert(Lanes > 0 && (Lanes & (Lanes - 1)) == 0, "a power of two");
  if constexpr (Lanes == 1) {
    return l[0];
  } else {
    double half[Lanes / 2];
    for (int64_t j = 0; j < Lanes / 2; ++j) half[j] = l[j] + l[j + Lanes / 2];
    return lane_total<Lanes / 2>(half);
  }
}
// sum over i < d of term(i), in the lanes above.
template <int64_t Lanes, typename F>
RELAY_CPU_INLINE double lane_sum(int64_t d, F&& term) {
  double lane[Lanes] = {};
  int64_t i = 0;
  for (; i + Lanes <= d; i += Lanes)
    for (int64_t l = 0; l < Lanes; ++l) lane[l] += term(i + l);
  for (int64_t l = 0; i < d; ++i, ++l) lane[l] += term(i);
  return lane_total<Lanes>(lane);
}
}  // namespace relay::cpu
