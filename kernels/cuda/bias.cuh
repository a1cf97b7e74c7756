// Bias of a linear layer: broadcast add over rows, and its gradient (column sums of dy). X is the
// storage type of y, bias and dy (float or __nv_bfloat16); the gradient db is always float32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// y (n, f) += bias (f), broadcast over rows.
template <typename X>
void add_bias(X* y, const X* bias, int64_t n, int64_t f, cudaStream_t stream);
// db (f) = beta * db + sum over rows of dy (n, f); with beta == 0, db is not read (BLAS convention). scratch:
// column_sum_scratch_bytes(n, f, 1) bytes of device memory (column_sum.cuh).
template <typename X>
void bias_grad(const X* dy, float* db, int64_t n, int64_t f, float beta, float* scratch, cudaStream_t stream);

}  // namespace relay::cuda
