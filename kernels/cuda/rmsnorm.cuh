// RMSNorm over the last dimension, as transformers' LlamaRMSNorm and torch.nn.RMSNorm (weight only, eps
// inside the sqrt; Zhang and Sennrich, arXiv:1910.07467): forward, gradient with respect to the input and
// to gamma. X is the storage type of x, y, dy, dx and gamma (float or __nv_bfloat16); rstd and dgamma are
// float32, and all math is float.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// x, y (n, d); gamma (d); rstd (n) saved for the backward pass.
template <typename X>
void rmsnorm_forward(const X* x, const X* gamma, float eps, X* y, float* rstd, int64_t n, int64_t d,
                     cudaStream_t stream);
// dx (n, d) from dy, x (n, d), gamma (d), rstd (n); dx may alias dy or x.
template <typename X>
void rmsnorm_backward_input(const X* dy, const X* x, const X* gamma, const float* rstd, X* dx, int64_t n, int64_t d,
                            cudaStream_t stream);
// dgamma (d) += sum over rows of dy * x * rstd. Deterministic (no atomics). scratch:
// column_sum_scratch_bytes(n, d, 1) bytes of device memory (column_sum.cuh).
template <typename X>
void rmsnorm_backward_weight(const X* dy, const X* x, const float* rstd, float* dgamma, int64_t n, int64_t d,
                             float* scratch, cudaStream_t stream);

}  // namespace relay::cuda
