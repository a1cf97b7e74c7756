// Tile amaxes by atomicMax on |x|'s bits (unsigned integers order like the non-negative floats they encode, and a
// NaN's bits sort above infinity's, as on the CPU). Tensorwise: each thread keeps its own maximum over its
// grid-stride elements and issues one atomic; tiled: one atomic per non-zero element (correct, not tuned).
#include "kernels/cuda/fp8_amax.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

__device__ inline unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <typename X>
__global__ void fp8_amax_tensor_kernel(const X* x, int64_t count, unsigned* amax) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, abs_bits(load(x[i])));
  if (m) atomicMax(amax, m);
}

template <typename X>
__global__ void fp8_amax_tiles_kernel(const X* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                                      int64_t grid_cols, unsigned* amax) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const unsigned bits = abs_bits(load(x[i]));
    if (bits) atomicMax(amax + (i / cols / tile_rows) * grid_cols + (i % cols) / tile_cols, bits);
  }
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void fp8_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, uint32_t* amax, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && cols >= 0 && amax && (rows * cols == 0 || x), "fp8_amax: " << rows << " x " << cols);
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  CUDA_CHECK(cudaMemsetAsync(amax, 0, size_t(g.rows * g.cols) * sizeof(uint32_t), stream));
  const int64_t count = rows * cols;
  if (count == 0) return;
  auto* out = reinterpret_cast<unsigned*>(amax);
  if (g.rows == 1 && g.cols == 1)
    fp8_amax_tensor_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(x, count, out);
  else
    fp8_amax_tiles_kernel<X><<<grid_for(count), kBlock, 0, stream>>>(x, rows, cols, g.tile_rows, g.tile_cols, g.cols,
                                                                      out);
  CUDA_CHECK(cudaGetLastError());
}

#define INST_FP8_AMAX(X) template void fp8_amax<X>(const X*, int64_t, int64_t, Fp8Tiling, uint32_t*, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST_FP8_AMAX)

}  // namespace relay::cuda
