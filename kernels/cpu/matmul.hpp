// Mixed-precision GEMM through oneDNN's matmul primitive: f32 or bf16 inputs, f32 accumulation, f32 or
// bf16 output, a fused bias and accumulation into the output (the sum post-op). Primitives are cached
// per call signature, because creating one costs milliseconds and running it microseconds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.hpp"

namespace relay::cpu {

// c (m, n) = alpha * op(a) @ op(b) [+ bias (n), broadcast over rows] + beta * c
// op(a) (m, k), op(b) (k, n); lda, ldb, ldc are row strides of a, b, c as stored (a stored (k, m) when trans_a).
// a and b are both f32 or both bf16; c is f32 or bf16; bias (n) is f32 or bf16 or null. Relay uses beta 0
// (c is then write-only: never read, may hold NaN) and 1; any other beta scales c the same way.
// Accumulation in f32; a bf16 c is rounded once (round-to-nearest-even), after bias and beta * c.
// One oneDNN matmul primitive per distinct (shape, strides, types, alpha, beta, bias, thread count)
// is created on first use and cached (creation costs milliseconds; execution microseconds).
struct MatmulArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  DType ab_type = DType::f32, c_type = DType::f32, bias_type = DType::f32;
  float alpha = 1.f, beta = 0.f;
};

// Throws relay::Error when oneDNN has no bf16 matmul for this CPU (it needs AVX512; hint: fp32 training)
// and bf16 GEMMs are not widened (below). Thread-safe: the cache is locked for lookups, and calls run on
// oneDNN's OpenMP threads concurrently.
void matmul(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias = nullptr);

// How bf16 inputs are multiplied. native: oneDNN's bf16 matmul primitive (AVX512_BF16 / AMX, or oneDNN's
// emulation on AVX512). widened: a and b widened to f32 (exactly: a bf16 is an f32 with its low 16 bits zero),
// dnnl_sgemm, and c rounded once, as native rounds it; the same math (exact products, f32 sums) in another
// summation order, on any x86-64, and faster where the CPU's bf16 dot products are no faster than its f32 FMAs
// (seen on an Intel Xeon with AVX512_BF16 and no AMX: the primitive at 0.56x dnnl_sgemm's rate, bench/RESULTS.md).
// Process-wide; native until set (CpuBackend sets it from train.cpu_bf16_gemm).
enum class Bf16Gemm { native, widened };
void set_bf16_gemm(Bf16Gemm mode);
Bf16Gemm bf16_gemm();
// The empty string when oneDNN has a bf16 matmul for this CPU, else its error message.
std::string native_bf16_missing();
// The CPU seconds of one (1024 x 1024 x 1024) GEMM with bf16 inputs by each path on the calling thread's OpenMP
// threads (the process's CPU time: time descheduled does not count): the best of `trials` runs, interleaved.
struct Bf16GemmTiming {
  double native_s = 0, widened_s = 0;
};
Bf16GemmTiming time_bf16_gemm(int trials);

// The oneDNN implementation that runs args ("brg:avx512_core_bf16", "gemm:jit", ...), creating and
// caching its primitive; "none" when no primitive runs (m, n or k is 0). For benchmarks and tests.
std::string matmul_impl(const MatmulArgs& args, bool has_bias);
// Primitives in the cache (tests check that repeated calls reuse one).
size_t matmul_cache_size();

}  // namespace relay::cpu
