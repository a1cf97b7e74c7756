// f32 GEMM through oneDNN's dnnl_sgemm (row-major, like the rest of Relay). bf16 and fused-bias
// GEMMs go through cpu::matmul (kernels/cpu/matmul.hpp), oneDNN's matmul primitive.
#include <dnnl.h>
#include <omp.h>

#include "core/error.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

namespace {
int g_threads = 1;
}

void set_threads(int threads) {
  g_threads = threads < 1 ? 1 : threads;
  omp_set_num_threads(g_threads);
}
int threads() { return g_threads; }

// Why f32 stays on dnnl_sgemm rather than cpu::matmul's primitive: on GPT-2 124M's eight GEMM
// shapes (bench_matmul, AMD EPYC Zen 4, 2 threads and 1, oneDNN 2.6.3) sgemm was 1-15% faster on
// seven (most for k = 50257 and the m = 50257 weight gradient) and tied on the eighth (x W_proj^T).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c (beta 0 does not read c), which dnnl_sgemm leaves undone
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    fatal(cat("dnnl_sgemm(", m, "x", n, "x", k, ") failed with oneDNN status ", static_cast<int>(st)), __FILE__,
          __LINE__);
}

}  // namespace relay::cpu
