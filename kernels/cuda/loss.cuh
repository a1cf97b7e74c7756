// Losses and predictions: fused softmax + cross-entropy (per-sample loss and dlogits), mean squared
// error, and argmax over classes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// logits (n, c), targets (n) in [0, c) -> losses (n) = -log softmax(logits)[target]; if dlogits is not
// null, dlogits (n, c) = (softmax - onehot(target)) * grad_scale (dlogits may alias logits).
// A target outside [0, c) gives a NaN loss and no onehot term (labels are validated when loaded).
void cross_entropy(const float* logits, const int32_t* targets, float grad_scale, float* losses,
                   float* dlogits, int64_t n, int64_t c, cudaStream_t stream);
// pred, target (n, k) -> losses (n) = mean over k of (pred - target)^2; if dpred is not null,
// dpred (n, k) = 2 (pred - target) / k * grad_scale.
void mse(const float* pred, const float* target, float grad_scale, float* losses, float* dpred,
         int64_t n, int64_t k, cudaStream_t stream);
// out (n) = index of the largest of logits (n, c) in each row; the first maximum wins.
void argmax(const float* logits, int32_t* out, int64_t n, int64_t c, cudaStream_t stream);
// Vocabulary-parallel cross-entropy, the three steps of Backend::cross_entropy_partial.
void row_max(const float* x, float* out, int64_t n, int64_t c, cudaStream_t stream);
void cross_entropy_partial(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t n, int64_t c, cudaStream_t stream);
void cross_entropy_finish(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, float* dlogits, int64_t n, int64_t c,
                          cudaStream_t stream);

}  // namespace relay::cuda
