// Losses and predictions: fused softmax + cross-entropy (per-sample loss and dlogits), mean squared
// error, argmax over classes, and the vocabulary-parallel cross-entropy's steps. X is the storage type
// of logits, pred, target and their gradients (float or __nv_bfloat16); losses, row maxima and partial
// sums are float32, and all math is float.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// logits (n, c), targets (n) in [0, c) -> losses (n) = -log softmax(logits)[target]; if dlogits is not
// null, dlogits (n, c) = (softmax - onehot(target)) * grad_scale (dlogits may alias logits).
// A target outside [0, c) gives a NaN loss and no onehot term (labels are validated when loaded).
template <typename X>
void cross_entropy(const X* logits, const int32_t* targets, float grad_scale, float* losses, X* dlogits, int64_t n,
                   int64_t c, cudaStream_t stream);
// pred, target (n, k) -> losses (n) = mean over k of (pred - target)^2; if dpred is not null,
// dpred (n, k) = 2 (pred - target) / k * grad_scale.
template <typename X>
void mse(const X* pred, const X* target, float grad_scale, float* losses, X* dpred, int64_t n, int64_t k,
         cudaStream_t stream);
// out (n) = index of the largest of logits (n, c) in each row; the first maximum wins.
template <typename X>
void argmax(const X* logits, int32_t* out, int64_t n, int64_t c, cudaStream_t stream);
// Vocabulary-parallel cross-entropy, the steps of Backend::cross_entropy_partial:
// out (n) = max of x (n, c) over each row.
template <typename X>
void row_max(const X* x, float* out, int64_t n, int64_t c, cudaStream_t stream);
// partial (n, 2) = [sum_j exp(logits - row_max), logits[target - vocab_start] or 0 when not in [0, c)].
template <typename X>
void cross_entropy_partial(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t n, int64_t c, cudaStream_t stream);
// losses (n) = log(total[., 0]) + row_max - total[., 1]; if dlogits (may alias logits):
// (exp(logits - lse) - onehot) * grad_scale over these c columns.
template <typename X>
void cross_entropy_finish(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, X* dlogits, int64_t n, int64_t c,
                          cudaStream_t stream);

}  // namespace relay::cuda
