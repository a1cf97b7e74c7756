// Multi-head latent attention's absorbed decode (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2), simple and exact rather
// than fast: a decode step reads the cache once per head.
//   store:  kv's row of each sequence into cache row t (a grid-stride copy), before the attention reads the cache.
//   decode: one block per (sequence, head). The query row in shared memory; warp w scores positions w, w + 8, ...
//           (a warp dot product over dk), the scores in scratch; the block's max and sum (block_max, block_sum: a
//           fixed order); then thread i sums output dim i (and i + 256, ...) over the positions in order, the
//           probabilities times the cached latents (coalesced: consecutive threads read consecutive dims of a row).
// Nothing is atomic; every output element has one owner, so the result is the same bits on every run.
#include "kernels/cuda/attention_decode_latent.cuh"

#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

namespace {

// kernels ---------------------------------------------------------------------------------------

// cache (n, Tmax, dk) row t of sequence b = kv (n, dk) row b.
template <typename X>
__global__ void latent_store_kernel(const X* kv, X* cache, int64_t n, int64_t t, int64_t Tmax, int64_t dk) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * dk; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / dk, c = i % dk;
    cache[(b * Tmax + t) * dk + c] = kv[i];
  }
}

// grid (n * H), block (kBlock). Block bh = b H + h: sequence b, head h.
template <typename X>
__global__ void attention_decode_latent_kernel(const X* q_in, const X* cache, X* out, float* scratch, int64_t t,
                                               int64_t Tmax, int64_t H, int64_t dk, int64_t r, float scale) {
  __shared__ float q_s[kLatentMaxDim];  // (dk) this head's absorbed query
  const int64_t bh = blockIdx.x, b = bh / H;
  const X* q = q_in + bh * dk;            // (dk): row b, head h of q (n, H*dk)
  const X* cb = cache + b * Tmax * dk;    // (Tmax, dk) this sequence's [latent | rotary key] per position
  float* a = scratch + bh * (t + 1);      // (t + 1) scores, then probabilities before normalising
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) q_s[i] = load(q[i]);
  __syncthreads();
  for (int64_t s = warp; s <= t; s += warps) {
    float dot = 0.0f;
    for (int64_t i = lane; i < dk; i += 32) dot += q_s[i] * load(cb[s * dk + i]);
    dot = warp_sum(dot);
    if (lane == 0) a[s] = dot * scale;
  }
  __syncthreads();  // every score written (global memory, visible to the block after the barrier)
  float mx = -INFINITY;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) mx = fmaxf(mx, a[s]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
    const float e = expf(a[s] - mx);
    a[s] = e;  // the thread that read the score writes its exponential
    sum += e;
  }
  sum = block_sum(sum);  // its barriers also publish the exponentials to the block
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x) {  // the values are the cached latents themselves
    float o = 0.0f;
    for (int64_t s = 0; s <= t; ++s) o += (a[s] * inv) * load(cb[s * dk + i]);
    store(out[bh * r + i], o);  // out (n, H*r): row b, head h
  }
}

}  // namespace

// launchers -------------------------------------------------------------------------------------

template <typename X>
void attention_decode_latent(const X* q, const X* kv, X* cache, X* out, float* scratch, int64_t n, int64_t t,
                             int64_t Tmax, int64_t H, int64_t dk, int64_t r, float scale, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && H > 0 && dk > 0 && dk <= kLatentMaxDim && r > 0 && r < dk && t >= 0 && t < Tmax &&
                   n * H <= INT_MAX,
               "attention_decode_latent: n " << n << ", t " << t << ", Tmax " << Tmax << ", H " << H << ", r + dr "
                                             << dk << " (at most " << kLatentMaxDim << "), r " << r);
  if (n == 0) return;
  RELAY_ASSERT(q && kv && cache && out && scratch, "attention_decode_latent: null pointer");
  latent_store_kernel<X><<<grid_for(n * dk), kBlock, 0, stream>>>(kv, cache, n, t, Tmax, dk);
  CUDA_CHECK(cudaGetLastError());
  attention_decode_latent_kernel<X><<<static_cast<unsigned>(n * H), kBlock, 0, stream>>>(q, cache, out, scratch, t,
                                                                                        Tmax, H, dk, r, scale);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                                  \
  template void attention_decode_latent<X>(const X*, const X*, X*, X*, float*, int64_t, int64_t, int64_t, int64_t, \
                                           int64_t, int64_t, float, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
