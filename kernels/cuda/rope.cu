// Rotary embedding kernel: one thread per (row, frequency i), which computes the angle's cos and sin once
// (in double, as kernels/rope_angles.hpp does on the CPU; YaRN's frequencies and factor when scaling is on) and
// rotates the pair (i, i + hd/2) of every head.
// Each pair is read before it is written by the same thread, so y may alias x.
// rotary_columns: one thread per (row, head, pe column), a copy (MLA's regrouping of its rotary columns).
#include "kernels/cuda/rope.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/rope_angles.hpp"

namespace relay::cuda {

template <typename X>
__global__ void rope_kernel(const X* x, X* y, int64_t rows, int64_t T, int64_t heads, int64_t hd, double theta,
                            int64_t pos0, bool inverse, const int32_t* positions, RopeScaling scaling) {
  const int64_t half = hd / 2, cols = heads * hd;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * half;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / half, f = i % half;
    float c, s;
    rope_cos_sin(pos0 + (positions ? int64_t(positions[r]) : r % T), f, hd, theta, scaling, c, s);
    if (inverse) s = -s;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = r * cols + h * hd + f;
      const float a = load(x[at]), b = load(x[at + half]);
      store(y[at], a * c - b * s);
      store(y[at + half], b * c + a * s);
    }
  }
}

template <typename X>
__global__ void rotary_columns_kernel(const X* src, X* dst, int64_t rows, int64_t heads, int64_t w, int64_t off,
                                      int64_t dr, bool interleaved, bool gather) {
  const int64_t half = dr / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * heads * dr;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % dr, rh = i / dr;  // pe column j of (row, head) rh
    const int64_t xj = !interleaved ? j : j < half ? 2 * j : 2 * (j - half) + 1;
    const int64_t xi = rh * w + off + xj;  // rh = r * heads + h, and x's row r, head h starts at (r * heads + h) * w
    if (gather) dst[i] = src[xi];
    else dst[xi] = src[i];
  }
}

template <typename X>
void rope(const X* x, X* y, int64_t rows, int64_t T, int64_t heads, int64_t hd, double theta, int64_t pos0,
          bool inverse, const int32_t* positions, const RopeScaling& scaling, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && T > 0 && heads > 0 && hd > 0 && hd % 2 == 0 && pos0 >= 0,
               "rope: rows " << rows << ", T " << T << ", heads " << heads << ", head dim " << hd << ", pos0 " << pos0);
  if (rows == 0) return;
  rope_kernel<X><<<grid_for(rows * (hd / 2)), kBlock, 0, stream>>>(x, y, rows, T, heads, hd, theta, pos0, inverse,
                                                                    positions, scaling);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void rotary_columns(const X* src, X* dst, int64_t rows, int64_t heads, int64_t w, int64_t off, int64_t dr,
                    bool interleaved, bool gather, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && heads > 0 && dr > 0 && off >= 0 && off + dr <= w && (!interleaved || dr % 2 == 0),
               "rotary_columns: rows " << rows << ", heads " << heads << ", head width " << w << ", columns [" << off
                                       << ", " << off + dr << ")");
  if (rows == 0) return;
  rotary_columns_kernel<X><<<grid_for(rows * heads * dr), kBlock, 0, stream>>>(src, dst, rows, heads, w, off, dr,
                                                                               interleaved, gather);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X) \
  template void rope<X>(const X*, X*, int64_t, int64_t, int64_t, int64_t, double, int64_t, bool, const int32_t*, \
                        const RopeScaling&, cudaStream_t); \
  template void rotary_columns<X>(const X*, X*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
