// Device helpers shared by the kernels in kernels/cuda/*.cu (llm.c's cuda_utils.cuh): launch sizes,
// storage-type loads and stores, and deterministic block reductions. Included only from .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.hpp"

namespace relay::cuda {

// Explicit instantiation of a launcher template for the two float storage types, so that the kernels
// stay in their .cu files: RELAY_CUDA_FOR_FLOAT_TYPES(INST) after #define INST(X) template void f<X>(...);
#define RELAY_CUDA_FOR_FLOAT_TYPES(M) M(float) M(__nv_bfloat16)

constexpr int kBlock = 256;         // threads per block for row and elementwise kernels
constexpr int64_t kMaxGrid = 4096;  // elementwise kernels use grid-stride loops beyond this

inline unsigned grid_for(int64_t count) {
  int64_t blocks = (count + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// One block per row: gridDim.x is limited to 2^31 - 1.
inline unsigned grid_rows(int64_t rows) {
  RELAY_ASSERT(rows >= 0 && rows <= 0x7fffffff, "too many rows for one kernel launch: " << rows);
  return static_cast<unsigned>(rows);
}

#ifdef __CUDACC__
// Kernels templated on the storage type X (float or __nv_bfloat16) compute in float: load widens,
// store rounds to nearest even (torch's rounding, and relay::f32_to_bf16's on the CPU).
__device__ inline float load(float x) { return x; }
__device__ inline float load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void store(float& dst, float v) { dst = v; }
__device__ inline void store(__nv_bfloat16& dst, float v) { dst = __float2bfloat16_rn(v); }

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 (at most 1024).
// The summation order is fixed, so results are bitwise reproducible. The first __syncthreads()
// keeps a second call in the same kernel from overwriting values a slow warp is still reading.
template <typename T>
__device__ inline T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_sum(total);
}

__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(m);
}
#endif  // __CUDACC__

}  // namespace relay::cuda
