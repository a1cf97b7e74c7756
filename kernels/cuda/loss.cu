// Loss kernels, one block per sample (row), on float or bf16 storage with float math. Softmax subtracts
// the row maximum before exponentiating, so the loss is logsumexp(x) - x[target] computed without
// overflow (llm.c's fused classifier).
#include "kernels/cuda/loss.cuh"

#include <cstdint>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

// A row of c values of X as a 16-byte-aligned body of words of 16 / sizeof(X) values between a scalar head and tail
// (a vocabulary of 50,257 leaves rows at every 2-byte offset): the loss reads the logits' row in words.
template <typename X>
struct RowWords {
  static constexpr int kPer = 16 / int(sizeof(X));
  int64_t head, words;  // head values before the first aligned word; whole words after them
  __device__ RowWords(const X* row, int64_t c) {
    const int64_t to_word = int64_t((16 - reinterpret_cast<uintptr_t>(row) % 16) % 16 / sizeof(X));
    head = to_word < c ? to_word : c;
    words = (c - head) / kPer;
  }
};

// grid (n), block (kBlock). Two passes over the row (llm.c's fused classifier, with an online softmax): each thread
// keeps a running maximum and the sum of exp(x - its maximum) over its values, rescaled when the maximum grows; the
// block combines them into the row's; the second pass writes the gradient (softmax - one-hot) x grad_scale. The
// row is read in 16-byte words (RowWords).
template <typename X>
__global__ void cross_entropy_kernel(const X* logits, const int32_t* targets, float grad_scale, float* losses,
                                     X* dlogits, int64_t c) {
  const int64_t row = blockIdx.x;
  const X* xr = logits + row * c;  // (c)
  const RowWords<X> rw(xr, c);
  constexpr int P = RowWords<X>::kPer;
  const uint4* body = reinterpret_cast<const uint4*>(xr + rw.head);  // (words) 16-byte words

  float m = -INFINITY, s = 0.0f;  // this thread's running maximum and sum of exp(x - m)
  auto see = [&](float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.0f;  // m = -inf at first: expf(-inf) = 0
      m = x;
    } else if (x != -INFINITY) {
      s += expf(x - m);
    }
  };
  for (int64_t j = threadIdx.x; j < rw.head; j += blockDim.x) see(load(xr[j]));
  for (int64_t i = threadIdx.x; i < rw.words; i += blockDim.x) {
    const uint4 w = body[i];
    const X* v = reinterpret_cast<const X*>(&w);
#pragma unroll
    for (int u = 0; u < P; ++u) see(load(v[u]));
  }
  for (int64_t j = rw.head + rw.words * P + threadIdx.x; j < c; j += blockDim.x) see(load(xr[j]));
  const float row_max = block_max(m);
  const float sum = block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_max));

  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < c, ignored = target < 0;  // ignored: no loss, no gradient
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : valid ? logf(sum) + row_max - load(xr[target]) : NAN;

  if (dlogits) {
    // dlogits may alias logits: each thread reads a value (or word) before writing the same positions, and this
    // barrier keeps thread 0's read of xr[target] for the loss ahead of every write.
    __syncthreads();
    X* dr = dlogits + row * c;  // (c)
    const float inv_sum = 1.0f / sum;
    auto grad = [&](int64_t j, float x) {
      const float onehot = (valid && j == target) ? 1.0f : 0.0f;
      return ignored ? 0.0f : (expf(x - row_max) * inv_sum - onehot) * grad_scale;
    };
    if (reinterpret_cast<uintptr_t>(dr) % 16 == reinterpret_cast<uintptr_t>(xr) % 16) {  // words in, words out
      uint4* out = reinterpret_cast<uint4*>(dr + rw.head);
      for (int64_t j = threadIdx.x; j < rw.head; j += blockDim.x) store(dr[j], grad(j, load(xr[j])));
      for (int64_t i = threadIdx.x; i < rw.words; i += blockDim.x) {
        const uint4 w = body[i];
        const X* v = reinterpret_cast<const X*>(&w);
        uint4 o;
        X* ov = reinterpret_cast<X*>(&o);
#pragma unroll
        for (int u = 0; u < P; ++u) store(ov[u], grad(rw.head + i * P + u, load(v[u])));
        out[i] = o;
      }
      for (int64_t j = rw.head + rw.words * P + threadIdx.x; j < c; j += blockDim.x) store(dr[j], grad(j, load(xr[j])));
    } else {
      for (int64_t j = threadIdx.x; j < c; j += blockDim.x) store(dr[j], grad(j, load(xr[j])));
    }
  }
}

// grid (n), block (kBlock)
template <typename X>
__global__ void mse_kernel(const X* pred, const X* target, float grad_scale, float* losses, X* dpred, int64_t k) {
  const int64_t row = blockIdx.x;
  const X* pr = pred + row * k;    // (k)
  const X* tr = target + row * k;  // (k)
  float local = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const float diff = load(pr[j]) - load(tr[j]);
    local += diff * diff;
  }
  const float sum = block_sum(local);
  if (threadIdx.x == 0) losses[row] = sum / static_cast<float>(k);
  if (dpred) {
    X* dr = dpred + row * k;  // (k)
    const float factor = 2.0f / static_cast<float>(k) * grad_scale;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) store(dr[j], (load(pr[j]) - load(tr[j])) * factor);
  }
}

// grid (n), block (kBlock): each thread scans its strided columns, then a shared-memory tree keeps the
// larger value, and the smaller index between equal values, so the first maximum wins.
template <typename X>
__global__ void argmax_kernel(const X* logits, int32_t* out, int64_t c) {
  __shared__ float best_val[kBlock];
  __shared__ int64_t best_idx[kBlock];
  const int64_t row = blockIdx.x;
  const X* xr = logits + row * c;  // (c)

  float v = -INFINITY;
  int64_t idx = c;  // c means "none yet": loses every tie
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float x = load(xr[j]);
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
template <typename X>
__global__ void row_max_kernel(const X* x, float* out, int64_t c) {
  const int64_t row = blockIdx.x;
  const X* xr = x + row * c;  // (c)
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) m = fmaxf(m, load(xr[j]));
  m = block_max(m);
  if (threadIdx.x == 0) out[row] = m;
}

// grid (n), block (kBlock): [sum exp(x - max), x[target] or 0] of this rank's columns.
template <typename X>
__global__ void cross_entropy_partial_kernel(const X* logits, const int32_t* targets, int64_t vocab_start,
                                             const float* row_max, float* partial, int64_t c) {
  const int64_t row = blockIdx.x;
  const X* xr = logits + row * c;  // (c)
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += expf(load(xr[j]) - row_max[row]);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[row]) - vocab_start;
    partial[2 * row] = s;
    partial[2 * row + 1] = t >= 0 && t < c ? load(xr[t]) : 0.0f;
  }
}

// grid (n), block (kBlock): the loss from the group's totals, and this rank's columns of dlogits
// (each element read and written by one thread: dlogits may alias logits).
template <typename X>
__global__ void cross_entropy_finish_kernel(const X* logits, const int32_t* targets, int64_t vocab_start,
                                            const float* row_max, const float* total, float grad_scale,
                                            float* losses, X* dlogits, int64_t c) {
  const int64_t row = blockIdx.x;
  const bool ignored = targets[row] < 0;  // no loss, no gradient
  const float lse = logf(total[2 * row]) + row_max[row];
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : lse - total[2 * row + 1];
  if (!dlogits) return;
  const X* xr = logits + row * c;  // (c)
  X* dr = dlogits + row * c;       // (c)
  const int64_t t = int64_t(targets[row]) - vocab_start;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    store(dr[j], ignored ? 0.0f : (expf(load(xr[j]) - lse) - (j == t ? 1.0f : 0.0f)) * grad_scale);
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void row_max(const X* x, float* out, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "row_max: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(x && out, "row_max: null pointer");
  row_max_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(x, out, c);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void cross_entropy_partial(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy_partial: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && targets && row_max && partial, "cross_entropy_partial: null pointer");
  cross_entropy_partial_kernel<X>
      <<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, vocab_start, row_max, partial, c);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void cross_entropy_finish(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, X* dlogits, int64_t n, int64_t c,
                          cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy_finish: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && targets && row_max && total && losses, "cross_entropy_finish: null pointer");
  cross_entropy_finish_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, vocab_start, row_max, total,
                                                                      grad_scale, losses, dlogits, c);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void cross_entropy(const X* logits, const int32_t* targets, float grad_scale, float* losses, X* dlogits, int64_t n,
                   int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0, "cross_entropy: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && targets && losses, "cross_entropy: null pointer");
  cross_entropy_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(logits, targets, grad_scale, losses, dlogits, c);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void mse(const X* pred, const X* target, float grad_scale, float* losses, X* dpred, int64_t n, int64_t k,
         cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && k > 0, "mse: n " << n << ", k " << k);
  if (n == 0) return;
  RELAY_ASSERT(pred && target && losses, "mse: null pointer");
  mse_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(pred, target, grad_scale, losses, dpred, k);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void argmax(const X* logits, int32_t* out, int64_t n, int64_t c, cudaStream_t stream) {
  RELAY_ASSERT(n >= 0 && c > 0 && c <= INT32_MAX, "argmax: n " << n << ", c " << c);
  if (n == 0) return;
  RELAY_ASSERT(logits && out, "argmax: null pointer");
  argmax_kernel<X><<<grid_rows(n), kBlock, 0, stream>>>(logits, out, c);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                                   \
  template void cross_entropy<X>(const X*, const int32_t*, float, float*, X*, int64_t, int64_t, cudaStream_t);   \
  template void mse<X>(const X*, const X*, float, float*, X*, int64_t, int64_t, cudaStream_t);                   \
  template void argmax<X>(const X*, int32_t*, int64_t, int64_t, cudaStream_t);                                   \
  template void row_max<X>(const X*, float*, int64_t, int64_t, cudaStream_t);                                    \
  template void cross_entropy_partial<X>(const X*, const int32_t*, int64_t, const float*, float*, int64_t, int64_t, \
                                         cudaStream_t);                                                          \
  template void cross_entropy_finish<X>(const X*, const int32_t*, int64_t, const float*, const float*, float,     \
                                        float*, X*, int64_t, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
