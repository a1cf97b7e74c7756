// Bias of a linear layer: broadcast add over rows, and its gradient (column sums of dy).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// y (n, f) += bias (f), broadcast over rows.
void add_bias(float* y, const float* bias, int64_t n, int64_t f, cudaStream_t stream);
// db (f) = beta * db + sum over rows of dy (n, f); with beta == 0, db is not read (BLAS convention).
void bias_grad(const float* dy, float* db, int64_t n, int64_t f, float beta, cudaStream_t stream);

}  // namespace relay::cuda
