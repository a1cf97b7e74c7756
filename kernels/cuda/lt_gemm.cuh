// cuBLASLt GEMMs with fused epilogues: the bias, and the bias then GELU, added in the GEMM's epilogue
// instead of separate passes over the output, with the GELU's input (the pre-activation) written
// alongside for the backward. cuBLASLt's GELU is the tanh approximation, GPT-2's gelu_tanh (llm.c trains
// GPT-2 with it; XLA fuses approximate GELU into it), which test_backend_ops's linear_gelu_tanh rows check
// against the CPU's. FP8 GEMMs (CUDA_R_8F_E4M3 / E5M2 operands with their dequantisation scales, per tensor or
// in Hopper's 1 x 128 / 128 x 128 blocks) go through the same cache. Algorithms come from
// cublasLtMatmulAlgoGetHeuristic once per call signature and are cached; one workspace serves all calls.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

namespace relay::cuda {

// Row-major, as relay's matmul: c (m, n) = epilogue(alpha * op(a) @ op(b) [+ bias (n)]) + beta * c, with
// op(a) (m, k), op(b) (k, n); lda, ldb, ldc are row strides as stored (a stored (k, m) when trans_a).
// a, b: ab_type; c, bias and aux: c_type (CUDA_R_32F or CUDA_R_16BF); accumulation in `compute`.
// gelu: the epilogue ends with gelu_tanh; aux, when not null, receives its input (m, n) with row stride
// ldc (cuBLASLt needs ldc divisible by 8 for it, and for dgelu_in below).
struct LtMatmul {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  cudaDataType_t ab_type = CUDA_R_32F, c_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  float alpha = 1.f, beta = 0.f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;  // (n), or null
  bool gelu = false;
  void* aux = nullptr;  // (m, n) pre-activation, or null; only with gelu
  // Backward instead (CUBLASLT_EPILOGUE_DGELU): c = gelu_tanh'(dgelu_in) * (alpha op(a) @ op(b)), with
  // dgelu_in (m, n) at row stride ldc the GELU's saved input; no bias, gelu false, aux null.
  const void* dgelu_in = nullptr;
  // FP8 (ab_type CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2, compute CUBLAS_COMPUTE_32F; no epilogue): b_type, when not -1,
  // b's own type (an e5m2 output gradient times e4m3 weights); a_scale and b_scale the device f32 dequantisation
  // scales (x = code * scale: cuBLASLt's A/B scale pointers multiply as Relay's scales do), laid out as a_scale_mode
  // and b_scale_mode (cublasLtMatmulMatrixScale_t: SCALAR_32F, or Hopper's VEC128_32F / BLK128x128_32F) say.
  int b_type = -1;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  int a_scale_mode = 0, b_scale_mode = 0;
};

class LtGemm {
 public:
  // workspace: device memory of workspace_bytes that this object uses for every GEMM it queues; the
  // caller keeps it alive and only uses these GEMMs on one stream at a time.
  LtGemm(void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Queues the GEMM on stream. False, with nothing queued, when cuBLASLt has no algorithm for it (the
  // heuristic found none, or aux's ldc is not a multiple of 8): the caller then runs its unfused form. An FP8
  // GEMM that cublasLtMatmul itself refuses (NOT_SUPPORTED, INVALID_VALUE: a scale-mode combination the heuristic
  // let through) is also false, said once on stderr, and its signature is not tried again.
  bool run(const LtMatmul& p, cudaStream_t stream);
  // Call signatures seen so far (each with its algorithm, or none).
  size_t cached() const;

 private:
  struct Cache;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::unique_ptr<Cache> cache_;
  mutable std::mutex mutex_;  // the cache, and the descriptors whose pointers each run sets
};

}  // namespace relay::cuda
