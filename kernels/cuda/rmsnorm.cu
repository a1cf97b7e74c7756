// RMSNorm kernels on float or bf16 storage (float math, float32 statistics), laid out as layernorm.cu: one
// block per row for the forward and the input gradient, a column reduction without atomics for gamma's.
//   y  = x * rstd * gamma,  rstd = 1 / sqrt(mean_j(x^2) + eps)
//   dx = rstd * g - x * rstd^3 * mean_j(g * x),  g = dy * gamma
#include "kernels/cuda/rmsnorm.cuh"

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

// grid (n), block (kBlock)
template <typename X>
__global__ void rmsnorm_forward_kernel(const X* x, const X* gamma, float eps, X* y, float* rstd_out, int64_t d) {
  const int64_t row = blockIdx.x;
  const X* xr = x + row * d;  // (d)
  X* yr = y + row * d;        // (d)
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = load(xr[j]);
    sq += v * v;
  }
  const float rstd = 1.0f / sqrtf(block_sum(sq) / static_cast<float>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) store(yr[j], load(xr[j]) * rstd * load(gamma[j]));
  if (threadIdx.x == 0) rstd_out[row] = rstd;
}

// grid (n), block (kBlock). Each element is read and written by the same thread, with a barrier between
// the passes, so dx may alias dy or x.
template <typename X>
__global__ void rmsnorm_backward_input_kernel(const X* dy, const X* x, const X* gamma, const float* rstd, X* dx,
                                              int64_t d) {
  const int64_t row = blockIdx.x;
  const X* dyr = dy + row * d;  // (d)
  const X* xr = x + row * d;    // (d)
  X* dxr = dx + row * d;        // (d)
  const float rs = rstd[row];
  float sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sgx += load(dyr[j]) * load(gamma[j]) * load(xr[j]);
  const float c = block_sum(sgx) / static_cast<float>(d) * rs * rs * rs;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    store(dxr[j], rs * (load(dyr[j]) * load(gamma[j])) - load(xr[j]) * c);
}

// grid (ceil(d / kColTile), column_slices(n)), block (kColTile, kRowGroups): partial (slices, d) of dgamma.
template <typename X>
__global__ void rmsnorm_backward_weight_kernel(const X* dy, const X* x, const float* rstd, float* partial, int64_t n,
                                               int64_t d) {
  column_partials<1>(n, d, partial, [&](int64_t row, int64_t col, float (&v)[1]) {
    v[0] = load(dy[row * d + col]) * (load(x[row * d + col]) * rstd[row]);
  });
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void rmsnorm_forward(const X* x, const X* gamma, float eps, X* y, float* rstd, int64_t n, int64_t d,
                     cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0 && eps >= 0.0f, "rmsnorm_forward: n " << n << ", d " << d << ", eps " << eps);
  if (n == 0) return;
  RELAY_ASSERT(x && gamma && y && rstd, "rmsnorm_forward: null pointer");
  rmsnorm_forward_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(x, gamma, eps, y, rstd, d);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void rmsnorm_backward_input(const X* dy, const X* x, const X* gamma, const float* rstd, X* dx, int64_t n, int64_t d,
                            cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0, "rmsnorm_backward_input: n " << n << ", d " << d);
  if (n == 0) return;
  RELAY_ASSERT(dy && x && gamma && rstd && dx, "rmsnorm_backward_input: null pointer");
  rmsnorm_backward_input_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(dy, x, gamma, rstd, dx, d);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void rmsnorm_backward_weight(const X* dy, const X* x, const float* rstd, float* dgamma, int64_t n, int64_t d,
                             float* scratch, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0, "rmsnorm_backward_weight: n " << n << ", d " << d);
  if (n == 0) return;
  RELAY_ASSERT(dy && x && rstd && dgamma && scratch, "rmsnorm_backward_weight: null pointer");
  const int64_t slices = column_slices(n);
  const dim3 block(kColTile, kRowGroups);
  const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile), static_cast<unsigned>(slices));
  rmsnorm_backward_weight_kernel<X><<<grid, block, 0, stream>>>(dy, x, rstd, scratch, n, d);
  CUDA_CHECK(cudaGetLastError());
  column_finish(scratch, slices, d, dgamma, 1.0f, stream);
}

#define INST(X)                                                                                              \
  template void rmsnorm_forward<X>(const X*, const X*, float, X*, float*, int64_t, int64_t, cudaStream_t);   \
  template void rmsnorm_backward_input<X>(const X*, const X*, const X*, const float*, X*, int64_t, int64_t,  \
                                          cudaStream_t);                                                     \
  template void rmsnorm_backward_weight<X>(const X*, const X*, const float*, float*, int64_t, int64_t, float*,     \
                                           cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
