// Losses as torch.nn.CrossEntropyLoss and torch.nn.MSELoss, per sample; the caller takes the mean
// (grad_scale = 1 / global batch) so that micro-batches and replicas add up to the global mean. A negative
// cross-entropy target is ignored (torch's ignore_index): loss 0 and a zero gradient row.
// Logits may be float or bf16; the softmax terms are float (fast_math's exp, relative error < 2e-7,
// vectorised: a GPT-2 vocabulary has 50257 of them per token) summed in double, in simd.hpp's lane_sum (the sum's
// grouping is the code's, not the vectoriser's). The row passes are compiled into each ISA clone (RELAY_CPU_INLINE).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/fast_math.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

namespace {
template <typename X>
RELAY_CPU_INLINE float max_of(const X* z, int64_t n) {
  float mx = load(z[0]);
#pragma omp simd reduction(max : mx)
  for (int64_t c = 1; c < n; ++c) mx = std::max(mx, load(z[c]));
  return mx;
}
// sum_c exp(z[c] - shift), every argument <= 0, in 16 of lane_sum's fixed lanes.
template <typename X>
RELAY_CPU_INLINE double sum_exp(const X* z, int64_t n, float shift) {
  return lane_sum<16>(n, [&](int64_t c) { return double(exp_neg_approx(load(z[c]) - shift)); });
}
// d[c] = (exp(z[c] - lse) - [c == t]) * grad_scale; d may alias z.
template <typename X>
RELAY_CPU_INLINE void softmax_grad(const X* z, X* d, int64_t n, double lse, int64_t t, float grad_scale) {
  const float l = float(lse);
  const bool mine = t >= 0 && t < n;
  const double zt = mine ? double(load(z[t])) : 0.0;  // read before d (which may be z) is written
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) store(d[c], exp_neg_approx(std::min(load(z[c]) - l, 0.f)) * grad_scale);
  if (mine) store(d[t], float((std::exp(zt - lse) - 1.0) * grad_scale));
}
}  // namespace

template <typename X>
RELAY_CPU_CLONES
void cross_entropy(const X* logits, const int32_t* targets, float grad_scale, float* losses, X* dlogits, int64_t rows,
                   int64_t classes) {
#pragma omp parallel for schedule(static) if (rows * classes > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {  // an ignored position (a document's last token): no loss, no gradient
      losses[r] = 0.0f;
      if (dlogits)
        for (int64_t c = 0; c < classes; ++c) store(dlogits[r * classes + c], 0.0f);
      continue;
    }
    const X* z = logits + r * classes;
    const float mx = max_of(z, classes);
    const double lse = std::log(sum_exp(z, classes, mx)) + mx;
    const int32_t t = targets[r];
    losses[r] = float(lse - load(z[t]));
    if (dlogits) softmax_grad(z, dlogits + r * classes, classes, lse, t, grad_scale);
  }
}

template <typename X>
RELAY_CPU_CLONES void row_max(const X* x, float* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) out[r] = max_of(x + r * cols, cols);
}

template <typename X>
RELAY_CPU_CLONES
void cross_entropy_partial(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const X* z = logits + r * cols;
    const int64_t t = int64_t(targets[r]) - vocab_start;
    partial[2 * r] = float(sum_exp(z, cols, row_max[r]));
    partial[2 * r + 1] = t >= 0 && t < cols ? load(z[t]) : 0.0f;
  }
}

template <typename X>
RELAY_CPU_CLONES
void cross_entropy_finish(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, X* dlogits, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {  // ignored: no loss, no gradient on any rank's columns
      losses[r] = 0.0f;
      if (dlogits)
        for (int64_t c = 0; c < cols; ++c) store(dlogits[r * cols + c], 0.0f);
      continue;
    }
    const double lse = std::log(double(total[2 * r])) + row_max[r];
    losses[r] = float(lse - total[2 * r + 1]);
    if (dlogits)
      softmax_grad(logits + r * cols, dlogits + r * cols, cols, lse, int64_t(targets[r]) - vocab_start, grad_scale);
  }
}

template <typename X>
void mse(const X* pred, const X* target, float grad_scale, float* losses, X* dpred, int64_t rows, int64_t k) {
#pragma omp parallel for schedule(static) if (rows * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t i = 0; i < k; ++i) {
      double e = double(load(pred[r * k + i])) - load(target[r * k + i]);
      s += e * e;
      if (dpred) store(dpred[r * k + i], float(2.0 * e / double(k) * grad_scale));
    }
    losses[r] = float(s / double(k));
  }
}

template <typename X>
void argmax(const X* logits, int32_t* out, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r) {
    const X* z = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (load(z[c]) > load(z[best])) best = c;
    out[r] = static_cast<int32_t>(best);
  }
}

#define INST(X)                                                                                                     \
  template void cross_entropy<X>(const X*, const int32_t*, float, float*, X*, int64_t, int64_t);                   \
  template void row_max<X>(const X*, float*, int64_t, int64_t);                                                    \
  template void cross_entropy_partial<X>(const X*, const int32_t*, int64_t, const float*, float*, int64_t, int64_t); \
  template void cross_entropy_finish<X>(const X*, const int32_t*, int64_t, const float*, const float*, float,      \
                                        float*, X*, int64_t, int64_t);                                             \
  template void mse<X>(const X*, const X*, float, float*, X*, int64_t, int64_t);                                   \
  template void argmax<X>(const X*, int32_t*, int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
