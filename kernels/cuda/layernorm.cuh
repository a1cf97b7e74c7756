// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance, eps inside the sqrt;
// Ba et al., arXiv:1607.06450): forward, gradient with respect to the input, and to gamma/beta.
// X is the storage type of x, y, dy, dx, gamma and beta (float or __nv_bfloat16); mean, rstd, dgamma
// and dbeta are float32, and all math is float.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// x, y (n, d); gamma, beta (d); mean, rstd (n) saved for the backward pass.
template <typename X>
void layernorm_forward(const X* x, const X* gamma, const X* beta, float eps, X* y, float* mean, float* rstd,
                       int64_t n, int64_t d, cudaStream_t stream);
// dx (n, d) from dy, x (n, d), gamma (d), mean, rstd (n); dx may alias dy or x.
template <typename X>
void layernorm_backward_input(const X* dy, const X* x, const X* gamma, const float* mean, const float* rstd, X* dx,
                              int64_t n, int64_t d, cudaStream_t stream);
// dgamma (d) += sum over rows of dy * xhat; dbeta (d) += sum over rows of dy. scratch:
// column_sum_scratch_bytes(n, d, 2) bytes of device memory (column_sum.cuh).
template <typename X>
void layernorm_backward_weight(const X* dy, const X* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t n, int64_t d, float* scratch, cudaStream_t stream);

}  // namespace relay::cuda
