// LayerNorm kernels on float or bf16 storage (float math, float32 statistics). Forward and input-gradient
// use one block per row with two passes over the row (mean, then the centred variance: no cancellation
// from E[x^2] - E[x]^2). The weight gradient is a column reduction laid out as in bias.cu, with no
// atomics so results are reproducible.
//   xhat = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps)
//   dx   = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)),  g = dy * gamma
#include "kernels/cuda/layernorm.cuh"

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

// grid (n), block (kBlock)
template <typename X>
__global__ void layernorm_forward_kernel(const X* x, const X* gamma, const X* beta, float eps, X* y,
                                         float* mean_out, float* rstd_out, int64_t d) {
  const int64_t row = blockIdx.x;
  const X* xr = x + row * d;  // (d)
  X* yr = y + row * d;        // (d)

  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += load(xr[j]);
  const float mean = block_sum(sum) / static_cast<float>(d);

  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = load(xr[j]) - mean;
    sq += c * c;
  }
  const float var = block_sum(sq) / static_cast<float>(d);
  const float rstd = 1.0f / sqrtf(var + eps);

  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    store(yr[j], (load(xr[j]) - mean) * rstd * load(gamma[j]) + load(beta[j]));
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// grid (n), block (kBlock). Each element is read and written by the same thread in both passes, with
// barriers between them, so dx may alias dy or x.
template <typename X>
__global__ void layernorm_backward_input_kernel(const X* dy, const X* x, const X* gamma, const float* mean,
                                                const float* rstd, X* dx, int64_t d) {
  const int64_t row = blockIdx.x;
  const X* dyr = dy + row * d;  // (d)
  const X* xr = x + row * d;    // (d)
  X* dxr = dx + row * d;        // (d)
  const float mu = mean[row], rs = rstd[row];

  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = load(dyr[j]) * load(gamma[j]);
    sum_g += g;
    sum_gx += g * (load(xr[j]) - mu) * rs;
  }
  const float mean_g = block_sum(sum_g) / static_cast<float>(d);
  const float mean_gx = block_sum(sum_gx) / static_cast<float>(d);

  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = load(dyr[j]) * load(gamma[j]);
    const float xhat = (load(xr[j]) - mu) * rs;
    store(dxr[j], rs * (g - mean_g - xhat * mean_gx));
  }
}

// grid (ceil(d / kColTile), column_slices(n)), block (kColTile, kRowGroups): partial (2, slices, d) of dgamma, dbeta.
template <typename X>
__global__ void layernorm_backward_weight_kernel(const X* dy, const X* x, const float* mean, const float* rstd,
                                                 float* partial, int64_t n, int64_t d) {
  column_partials<2>(n, d, partial, [&](int64_t row, int64_t col, float (&v)[2]) {
    const float g = load(dy[row * d + col]);
    v[0] = g * (load(x[row * d + col]) - mean[row]) * rstd[row];
    v[1] = g;
  });
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void layernorm_forward(const X* x, const X* gamma, const X* beta, float eps, X* y, float* mean, float* rstd,
                       int64_t n, int64_t d, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0, "layernorm_forward: n " << n << ", d " << d);
  RELAY_ASSERT(eps >= 0.0f, "layernorm_forward: eps " << eps);
  if (n == 0) return;
  RELAY_ASSERT(x && gamma && beta && y && mean && rstd, "layernorm_forward: null pointer");
  layernorm_forward_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(x, gamma, beta, eps, y, mean, rstd, d);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void layernorm_backward_input(const X* dy, const X* x, const X* gamma, const float* mean, const float* rstd, X* dx,
                              int64_t n, int64_t d, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0, "layernorm_backward_input: n " << n << ", d " << d);
  if (n == 0) return;
  RELAY_ASSERT(dy && x && gamma && mean && rstd && dx, "layernorm_backward_input: null pointer");
  layernorm_backward_input_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(dy, x, gamma, mean, rstd, dx, d);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void layernorm_backward_weight(const X* dy, const X* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t n, int64_t d, float* scratch, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && d > 0, "layernorm_backward_weight: n " << n << ", d " << d);
  if (n == 0) return;
  RELAY_ASSERT(dy && x && mean && rstd && dgamma && dbeta && scratch, "layernorm_backward_weight: null pointer");
  const int64_t slices = column_slices(n);
  const dim3 block(kColTile, kRowGroups);
  const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile), static_cast<unsigned>(slices));
  layernorm_backward_weight_kernel<X><<<grid, block, 0, stream>>>(dy, x, mean, rstd, scratch, n, d);
  CUDA_CHECK(cudaGetLastError());
  column_finish(scratch, slices, d, dgamma, 1.0f, stream);
  column_finish(scratch + slices * d, slices, d, dbeta, 1.0f, stream);
}

#define INST(X)                                                                                                   \
  template void layernorm_forward<X>(const X*, const X*, const X*, float, X*, float*, float*, int64_t, int64_t,  \
                                     cudaStream_t);                                                               \
  template void layernorm_backward_input<X>(const X*, const X*, const X*, const float*, const float*, X*, int64_t, \
                                            int64_t, cudaStream_t);                                               \
  template void layernorm_backward_weight<X>(const X*, const X*, const float*, const float*, float*, float*,      \
                                             int64_t, int64_t, float*, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
