// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance, eps inside the sqrt;
// Ba et al., arXiv:1607.06450): forward, gradient with respect to the input, and to gamma/beta.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// x, y (n, d); gamma, beta (d); mean, rstd (n) saved for the backward pass.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, float* y,
                       float* mean, float* rstd, int64_t n, int64_t d, cudaStream_t stream);
// dx (n, d) from dy, x (n, d), gamma (d), mean, rstd (n).
void layernorm_backward_input(const float* dy, const float* x, const float* gamma, const float* mean,
                              const float* rstd, float* dx, int64_t n, int64_t d, cudaStream_t stream);
// dgamma (d) += sum over rows of dy * xhat; dbeta (d) += sum over rows of dy.
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                               float* dgamma, float* dbeta, int64_t n, int64_t d, cudaStream_t stream);

}  // namespace relay::cuda
