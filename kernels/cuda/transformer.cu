// Embedding, causal attention and KV-cache decoding kernels, on float or bf16 storage where templated
// (llm.c's attention_forward_kernel1 and its CPU backward are the model for the loops). Each thread
// owns its outputs and visits its inputs in a fixed order, so results are bitwise reproducible and no
// float atomics are used.
#include "kernels/cuda/transformer.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

template <typename X>
__global__ void embedding_forward_kernel(const int32_t* tokens, const X* wte, const X* wpe, X* out, int64_t rows,
                                         int64_t C, int64_t T, int64_t vocab_start, int64_t vocab_rows,
                                         const int32_t* positions) {
  const int64_t n = rows * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C, v = int64_t(tokens[r]) - vocab_start;
    const float e = v >= 0 && v < vocab_rows ? load(wte[v * C + c]) : 0.0f;  // another tp rank's token: 0
    const int64_t p = positions ? int64_t(positions[r]) : r % T;
    store(out[i], e + (wpe ? load(wpe[p * C + c]) : 0.0f));
  }
}

// dwte by token runs: the (token, row) pairs sorted by token with a stable radix sort (rows in order within a
// token), then one warp per run of equal tokens sums its rows' gradients in row order, lane c taking channels
// c, c + 32, ..., and adds the sum to the token's row: every element has one owner and a fixed order, without the
// serial walk over every row that one thread per channel would make (16k dependent steps at GPT-2's batch).
__global__ void embedding_sort_keys_kernel(const int32_t* tokens, int32_t* keys, int32_t* rows_idx, int64_t rows,
                                           int64_t vocab_start, int64_t vocab_rows) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(tokens[r]) - vocab_start;
    keys[r] = v >= 0 && v < vocab_rows ? int32_t(v) : int32_t(vocab_rows);  // another tp rank's token: sorted last
    rows_idx[r] = int32_t(r);
  }
}

template <typename X>
__global__ void embedding_backward_runs_kernel(const int32_t* keys, const int32_t* rows_idx, const X* dout,
                                               float* dwte, int64_t rows, int64_t C, int64_t vocab_rows) {
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;  // one warp per sorted position
  const int lane = threadIdx.x % 32;
  if (i >= rows) return;
  const int32_t v = keys[i];
  if (v >= vocab_rows || (i > 0 && keys[i - 1] == v)) return;  // not the start of an in-range run
  int64_t end = i + 1;
  while (end < rows && keys[end] == v) ++end;
  for (int64_t c = lane; c < C; c += 32) {
    float s = 0.0f;
    for (int64_t j = i; j < end; ++j) s += load(dout[int64_t(rows_idx[j]) * C + c]);
    dwte[int64_t(v) * C + c] += s;
  }
}

// One thread per (position, channel): the sum over sequences in order.
template <typename X>
__global__ void embedding_backward_wpe_kernel(const X* dout, float* dwpe, int64_t rows, int64_t C, int64_t T) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i % C;
    float s = 0.0f;
    for (int64_t r = t; r < rows; r += T) s += load(dout[r * C + c]);
    dwpe[i] += s;
  }
}

// One thread per (b, t, h): scores, softmax and the weighted sum of values for one query.
__global__ void attention_forward_kernel(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C,
                                         int64_t H) {
  const int64_t hd = C / H, C3 = 3 * C, n = B * T * H;
  const float scale = rsqrtf(float(hd));
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % H, t = (i / H) % T, b = i / (H * T);
    const float* q = qkv + (b * T + t) * C3 + h * hd;
    float* a = att + ((b * H + h) * T + t) * T;
    float mx = -INFINITY;
    for (int64_t s = 0; s <= t; ++s) {
      const float* k = qkv + (b * T + s) * C3 + C + h * hd;
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += q[d] * k[d];
      a[s] = dot * scale;
      mx = fmaxf(mx, a[s]);
    }
    float sum = 0.0f;
    for (int64_t s = 0; s <= t; ++s) {
      a[s] = expf(a[s] - mx);
      sum += a[s];
    }
    const float inv = 1.0f / sum;
    for (int64_t s = 0; s <= t; ++s) a[s] *= inv;
    for (int64_t s = t + 1; s < T; ++s) a[s] = 0.0f;
    float* o = out + (b * T + t) * C + h * hd;
    for (int64_t d = 0; d < hd; ++d) {
      float acc = 0.0f;
      for (int64_t s = 0; s <= t; ++s) acc += a[s] * qkv[(b * T + s) * C3 + 2 * C + h * hd + d];
      o[d] = acc;
    }
  }
}

// One thread per (b, h, t): d att[t, s] = dout_t . v_s, then the softmax backward into
// scratch[t, s] = att (d att - sum_r att d att) x scale (0 above the diagonal).
__global__ void attention_dpre_kernel(const float* dout, const float* qkv, const float* att, float* dpre, int64_t B,
                                      int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H, C3 = 3 * C, n = B * H * T;
  const float scale = rsqrtf(float(hd));
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i % T, h = (i / T) % H, b = i / (T * H);
    const float* a = att + i * T;
    const float* dy = dout + (b * T + t) * C + h * hd;
    float* g = dpre + i * T;
    float inner = 0.0f;
    for (int64_t s = 0; s <= t; ++s) {
      const float* v = qkv + (b * T + s) * C3 + 2 * C + h * hd;
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += dy[d] * v[d];
      g[s] = dot;  // d att, for now
      inner += a[s] * dot;
    }
    for (int64_t s = 0; s <= t; ++s) g[s] = a[s] * (g[s] - inner) * scale;
    for (int64_t s = t + 1; s < T; ++s) g[s] = 0.0f;
  }
}

// One thread per (b, t, h, d): dq = sum_s g[t, s] k_s; dk_t = sum_{r >= t} g[r, t] q_r;
// dv_t = sum_{r >= t} att[r, t] dout_r.
__global__ void attention_dqkv_kernel(const float* dout, const float* qkv, const float* att, const float* dpre,
                                      float* dqkv, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H, C3 = 3 * C, n = B * T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, t = (i / C) % T, b = i / (C * T), h = c / hd, d = c % hd;
    const float* g = dpre + (b * H + h) * T * T;  // (T, T)
    const float* a = att + (b * H + h) * T * T;
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int64_t s = 0; s <= t; ++s) dq += g[t * T + s] * qkv[(b * T + s) * C3 + C + h * hd + d];
    for (int64_t r = t; r < T; ++r) {
      dk += g[r * T + t] * qkv[(b * T + r) * C3 + h * hd + d];
      dv += a[r * T + t] * dout[(b * T + r) * C + h * hd + d];
    }
    float* row = dqkv + (b * T + t) * C3;
    row[c] = dq;
    row[C + c] = dk;
    row[2 * C + c] = dv;
  }
}

// Caches (n, Tmax, KV*hd): row t of sequence b = k, v (n rows, ldkv apart, KV*hd columns).
template <typename X>
__global__ void kv_store_kernel(const X* k, const X* v, int64_t ldkv, X* kcache, X* vcache, int64_t n, int64_t t,
                                int64_t Tmax, int64_t Ckv) {
  const int64_t m = n * Ckv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / Ckv, c = i % Ckv;
    kcache[(b * Tmax + t) * Ckv + c] = k[b * ldkv + c];
    vcache[(b * Tmax + t) * Ckv + c] = v[b * ldkv + c];
  }
}

constexpr int kMaxHeadDim = 256;

// One thread per (b, h): an online softmax over the cached positions [0, t]. q (n rows, ldq apart); query
// head h reads key/value head h / (H / KV) of the caches (n, Tmax, KV*hd); out (n, H*hd).
template <typename X>
__global__ void attention_decode_kernel(const X* q_in, int64_t ldq, const X* kcache, const X* vcache, X* out,
                                        int64_t n, int64_t t, int64_t Tmax, int64_t H, int64_t KV, int64_t hd) {
  const float scale = rsqrtf(float(hd));
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / H, h = i % H, kvo = (h / group) * hd;
    const X* q = q_in + b * ldq + h * hd;  // (hd)
    float acc[kMaxHeadDim];
    for (int64_t d = 0; d < hd; ++d) acc[d] = 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t s = 0; s <= t; ++s) {
      const X* k = kcache + (b * Tmax + s) * Ckv + kvo;  // (hd)
      const X* v = vcache + (b * Tmax + s) * Ckv + kvo;  // (hd)
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += load(q[d]) * load(k[d]);
      const float z = dot * scale, m2 = fmaxf(mx, z), shrink = expf(mx - m2), w = expf(z - m2);
      sum = sum * shrink + w;
      for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * shrink + w * load(v[d]);
      mx = m2;
    }
    for (int64_t d = 0; d < hd; ++d) store(out[b * C + h * hd + d], acc[d] / sum);
  }
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void embedding_forward(const int32_t* tokens, const X* wte, const X* wpe, X* out, int64_t rows, int64_t C, int64_t T,
                       int64_t vocab_start, int64_t vocab_rows, const int32_t* positions, cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && C > 0 && T > 0, "embedding_forward: rows " << rows << ", C " << C << ", T " << T);
  if (rows == 0) return;
  RELAY_ASSERT(tokens && wte && out, "embedding_forward: null pointer");
  embedding_forward_kernel<X><<<grid_for(rows * C), kBlock, 0, stream>>>(tokens, wte, wpe, out, rows, C, T,
                                                                          vocab_start, vocab_rows, positions);
  CUDA_CHECK(cudaGetLastError());
}

size_t embedding_backward_scratch_bytes(int64_t rows) {
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), static_cast<int>(rows)));
  return 4 * size_t(rows) * sizeof(int32_t) + sort_bytes + 256;
}

template <typename X>
void embedding_backward(const int32_t* tokens, const X* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows, const int32_t* positions, void* scratch,
                        cudaStream_t stream) {
  RELAY_ASSERT(rows >= 0 && C > 0 && T > 0, "embedding_backward: rows " << rows << ", C " << C << ", T " << T);
  if (rows == 0) return;
  RELAY_ASSERT(tokens && dout && dwte && scratch, "embedding_backward: null pointer");
  RELAY_ASSERT(rows <= INT_MAX && vocab_rows < INT_MAX, "embedding_backward: rows " << rows << ", vocab " << vocab_rows);
  // scratch: keys, row indices, and their sorted copies (rows int32 each), then cub's temporary storage.
  int32_t* keys = static_cast<int32_t*>(scratch);
  int32_t* idx = keys + rows;
  int32_t* keys_sorted = idx + rows;
  int32_t* idx_sorted = keys_sorted + rows;
  void* temp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(idx_sorted + rows) + 255) / 256 * 256);
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, keys_sorted, idx, idx_sorted, int(rows)));
  embedding_sort_keys_kernel<<<grid_for(rows), kBlock, 0, stream>>>(tokens, keys, idx, rows, vocab_start, vocab_rows);
  CUDA_CHECK(cudaGetLastError());
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) <= vocab_rows) ++end_bit;  // keys in [0, vocab_rows]
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, keys_sorted, idx, idx_sorted, int(rows), 0,
                                             end_bit, stream));
  const int64_t threads = rows * 32;
  embedding_backward_runs_kernel<X><<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      keys_sorted, idx_sorted, dout, dwte, rows, C, vocab_rows);
  CUDA_CHECK(cudaGetLastError());
  if (!dwpe) return;
  if (!positions) {
    embedding_backward_wpe_kernel<X><<<grid_for(T * C), kBlock, 0, stream>>>(dout, dwpe, rows, C, T);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  // Positions restarting with each document: dwpe by position runs, the same sort with the positions as keys
  // (the scratch is free again: the launches above read it earlier on this stream).
  embedding_sort_keys_kernel<<<grid_for(rows), kBlock, 0, stream>>>(positions, keys, idx, rows, 0, T);
  CUDA_CHECK(cudaGetLastError());
  end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) <= T) ++end_bit;  // keys in [0, T]
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, keys_sorted, idx, idx_sorted, int(rows), 0,
                                             end_bit, stream));
  embedding_backward_runs_kernel<X><<<static_cast<unsigned>((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      keys_sorted, idx_sorted, dout, dwpe, rows, C, T);
  CUDA_CHECK(cudaGetLastError());
}

void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H,
                       cudaStream_t stream) {
  RELAY_ASSERT(B > 0 && T > 0 && H > 0 && C % H == 0, "attention_forward: B " << B << ", T " << T << ", C " << C
                                                                              << ", H " << H);
  attention_forward_kernel<<<grid_for(B * T * H), kBlock, 0, stream>>>(qkv, att, out, B, T, C, H);
  CUDA_CHECK(cudaGetLastError());
}

void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, float* scratch, int64_t B,
                        int64_t T, int64_t C, int64_t H, cudaStream_t stream) {
  RELAY_ASSERT(B > 0 && T > 0 && H > 0 && C % H == 0 && scratch, "attention_backward: B " << B << ", T " << T
                                                                                         << ", C " << C << ", H " << H);
  attention_dpre_kernel<<<grid_for(B * H * T), kBlock, 0, stream>>>(dout, qkv, att, scratch, B, T, C, H);
  CUDA_CHECK(cudaGetLastError());
  attention_dqkv_kernel<<<grid_for(B * T * C), kBlock, 0, stream>>>(dout, qkv, att, scratch, dqkv, B, T, C, H);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void attention_decode_gqa(const X* q, int64_t ldq, const X* k, const X* v, int64_t ldkv, X* kcache, X* vcache, X* out,
                          int64_t n, int64_t t, int64_t Tmax, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream) {
  RELAY_ASSERT(n > 0 && H > 0 && KV > 0 && H % KV == 0 && hd > 0 && hd <= kMaxHeadDim && t >= 0 && t < Tmax,
               "attention_decode: n " << n << ", t " << t << ", Tmax " << Tmax << ", H " << H << ", KV " << KV
                                      << ", head dim " << hd << " (at most " << kMaxHeadDim << ")");
  kv_store_kernel<X><<<grid_for(n * KV * hd), kBlock, 0, stream>>>(k, v, ldkv, kcache, vcache, n, t, Tmax, KV * hd);
  CUDA_CHECK(cudaGetLastError());
  attention_decode_kernel<X><<<grid_for(n * H), kBlock, 0, stream>>>(q, ldq, kcache, vcache, out, n, t, Tmax, H, KV,
                                                                     hd);
  CUDA_CHECK(cudaGetLastError());
}

template <typename X>
void attention_decode(const X* qkv, X* kcache, X* vcache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t C,
                      int64_t H, cudaStream_t stream) {
  RELAY_ASSERT(H > 0 && C % H == 0, "attention_decode: C " << C << ", H " << H);
  attention_decode_gqa(qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, kcache, vcache, out, n, t, Tmax, H, H, C / H, stream);
}

#define INST(X)                                                                                                  \
  template void embedding_forward<X>(const int32_t*, const X*, const X*, X*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, const int32_t*, cudaStream_t);                                     \
  template void embedding_backward<X>(const int32_t*, const X*, float*, float*, int64_t, int64_t, int64_t,       \
                                      int64_t, int64_t, const int32_t*, void*, cudaStream_t);                    \
  template void attention_decode<X>(const X*, X*, X*, X*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void attention_decode_gqa<X>(const X*, int64_t, const X*, const X*, int64_t, X*, X*, X*, int64_t, int64_t, \
                                        int64_t, int64_t, int64_t, int64_t, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
