// Sum of squares of a tensor (gradient norms for clipping and logging), reduced on the device in
// double so the host reads back one number.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

constexpr int kSumSquaresMaxBlocks = 1024;  // size of the partial-sum buffer the caller provides

// out[0] = sum of x[i]^2 over x (count), in double. partial is device scratch of
// kSumSquaresMaxBlocks doubles; out is one device double. Deterministic for a given count.
void sum_squares(const float* x, int64_t count, double* partial, double* out, cudaStream_t stream);

}  // namespace relay::cuda
