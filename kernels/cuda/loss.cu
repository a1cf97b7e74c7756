// Loss kernels, one block per sample (row). Softmax subtracts the row maximum before exponentiating,
// so the loss is logsumexp(x) - x[target] computed without overflow (llm.c's fused classifier).
#include "kernels/cuda/loss.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

// grid (n), block (kBlock)
__global__ void cross_entropy_kernel(const float* logits, const int32_t* targets, float grad_scale,
                                     float* losses, float* dlogits, int64_t c) {
  const int64_t row = blockIdx.x;
  const float* xr = logits + row * c;

  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) local_max = fmaxf(local_max, xr[j]);
  const float row_max = block_max(local_max);

  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) local_sum += expf(xr[j] - row_max);
  const float sum = block_sum(local_sum);

  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < c;
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) + row_max - xr[target] : NAN;

  if (dlogits) {
    // dlogits may alias logits: each thread reads xr[j] before writing dr[j] for the same j, and this
    // barrier keeps thread 0's read of xr[target] for the loss ahead of every write.
    __syncthreads();
    float* dr = dlogits + row * c;
    const float inv_sum = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float p = expf(xr[j] - row_max) * inv_sum;
      const float onehot = (valid && j == target) ? 1.0f : 0.0f;
      dr[j] = (p - onehot) * grad_scale;
    }
  }
}

// grid (n), block (kBlock)
__global__ void mse_kernel(const float* pred, const float* target, float grad_scale, float* losses,
                           float* dpred, int64_t k) {
  const int64_t row = blockIdx.x;
  const float* pr = pred + row * k;
  const float* tr = target + row * k;
  float local = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const float diff = pr[j] - tr[j];
    local += diff * diff;
  }
  const float sum = block_sum(local);
  if (threadIdx.x == 0) losses[row] = sum / static_cast<float>(k);
  if (dpred) {
    float* dr = dpred + row * k;
    const float factor = 2.0f / static_cast<float>(k) * grad_scale;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) dr[j] = (pr[j] - tr[j]) * factor;
  }
}

// grid (n), block (kBlock): each thread scans its strided columns, then a shared-memory tree keeps the
// larger value, and the smaller index between equal values, so the first maximum wins.
__global__ void argmax_kernel(const float* logits, int32_t* out, int64_t c) {
  __shared__ float best_val[kBlock];
  __shared__ int64_t best_idx[kBlock];
  const int64_t row = blockIdx.x;
  const float* xr = logits + row * c;

  float v = -INFINITY;
  int64_t idx = c;  // c means "none yet": loses every tie
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float x = xr[j];
    if (idx == c || x > v) {
      v = x;
      idx = j;
    }
  }
  best_val[threadIdx.x] = v;
  best_idx[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = best_val[threadIdx.x + stride];
      const int64_t oi = best_idx[threadIdx.x + stride];
      const float mv = best_val[threadIdx.x];
      const int64_t mi = best_idx[threadIdx.x];
      const bool other_wins = oi != c && (mi == c || ov > mv || (ov == mv && oi < mi));
      if (other_wins) {
        best_val[threadIdx.x] = ov;
        best_idx[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[row] = static_cast<int32_t>(best_idx[0]);
}

// grid (n), block (kBlock): the row's maximum.
__global__ void row_max_kernel(const float* x, float* out, int64_t c) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * c;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m);
  if (threadIdx.x == 0) out[row] = m;
}

// grid (n), block (kBlock): [sum exp(x - max), x[target] or 0] of this rank's columns.
__global__ void cross_entropy_partial_kernel(const float* logits, const int32_t* targets, int64_t vocab_start,
                                             const float* row_max, float* partial, int64_t c) {
  const int64_t row = blockIdx.x;
  const float* xr = logits + row * c;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += expf(xr[j] - row_max[row]);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[row]) - vocab_start;
    partial[2 * row] = s;
    partial[2 * row + 1] = t >= 0 && t < c ? xr[t] : 0.0f;
  }
}

// grid (n), block (kBlock): the loss from the group's totals, and this rank's columns of dlogits.
__global__ void cross_entropy_finish_kernel(const float* logits, const int32_t* targets, int64_t vocab_start,
                                            const float* row_max, const float* total, float grad_scale,
                                            float* losses, float* dlogits, int64_t c) {
  const int64_t row = blockIdx.x;
  const float lse = logf(total[2 * row]) + row_max[row];
  if (threadIdx.x == 0) losses[row] = lse - total[2 * row + 1];
  if (!dlogits) return;
  const float* xr = logits + row * c;
  float* dr = dlogits + row * c;
  const int64_t t = int64_t(targets[row]) - vocab_start;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) dr[j] = (expf(xr[j] - lse) - (j == t ? 1.0f : 0.0f)) * grad_scale;
}

// launchers -------------------------------------------------------------------------------------

void row_max(const float* x, float* out, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "row_max: n " << n << ", c " << c);
  if (n == 0) return;
  row_max_kernel<<<grid_rows(n), kBlock, 0, stream>>>(x, out, c);
  CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_partial(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy_partial: n " << n << ", c " << c);
  if (n == 0) return;
  cross_entropy_partial_kernel<<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, vocab_start, row_max, partial, c);
  CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_finish(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, float* dlogits, int64_t n, int64_t c,
                          cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy_finish: n " << n << ", c " << c);
  if (n == 0) return;
  cross_entropy_finish_kernel<<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, vocab_start, row_max, total,
                                                                   grad_scale, losses, dlogits, c);
  CUDA_CHECK(cudaGetLastError());
}

void cross_entropy(const float* logits, const int32_t* targets, float grad_scale, float* losses,
                   float* dlogits, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && targets && losses, "cross_entropy: null pointer");
  cross_entropy_kernel<<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, grad_scale, losses,
                                                                        dlogits, c);
  CUDA_CHECK(cudaGetLastError());
}

void mse(const float* pred, const float* target, float grad_scale, float* losses, float* dpred,
         int64_t n, int64_t k, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && k > 0, "mse: n " << n << ", k " << k);
  if (n == 0) return;
  RELAY_ASSERT(pred && target && losses, "mse: null pointer");
  mse_kernel<<<grid_rows(n), kBlock, 0, stream>>>(pred, target, grad_scale, losses, dpred, k);
  CUDA_CHECK(cudaGetLastError());
}

void argmax(const float* logits, int32_t* out, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0 && c <= INT32_MAX, "argmax: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && out, "argmax: null pointer");
  argmax_kernel<<<grid_rows(n), kBlock, 0, stream>>>(logits, out, c);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace relay::cuda
