// Losses as torch.nn.CrossEntropyLoss and torch.nn.MSELoss, per sample; the caller takes the mean
// (grad_scale = 1 / global batch) so that micro-batches and replicas add up to the global mean.
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

void cross_entropy(const float* logits, const int32_t* targets, float grad_scale, float* losses, float* dlogits,
                   int64_t rows, int64_t classes) {
#pragma omp parallel for schedule(static) if (rows * classes > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    float mx = z[0];
    for (int64_t c = 1; c < classes; ++c) mx = std::max(mx, z[c]);
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(double(z[c]) - mx);
    double lse = std::log(s) + mx;
    int32_t t = targets[r];
    losses[r] = float(lse - z[t]);
    if (dlogits) {
      float* d = dlogits + r * classes;
      for (int64_t c = 0; c < classes; ++c) {
        double p = std::exp(double(z[c]) - lse);
        d[c] = float((p - (c == t ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
}

void row_max(const float* x, float* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = x + r * cols;
    float mx = z[0];
    for (int64_t c = 1; c < cols; ++c) mx = std::max(mx, z[c]);
    out[r] = mx;
  }
}

void cross_entropy_partial(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * cols;
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(double(z[c]) - row_max[r]);
    const int64_t t = int64_t(targets[r]) - vocab_start;
    partial[2 * r] = float(s);
    partial[2 * r + 1] = t >= 0 && t < cols ? z[t] : 0.0f;
  }
}

void cross_entropy_finish(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, float* dlogits, int64_t rows,
                          int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const double lse = std::log(double(total[2 * r])) + row_max[r];
    losses[r] = float(lse - total[2 * r + 1]);
    if (!dlogits) continue;
    const float* z = logits + r * cols;
    float* d = dlogits + r * cols;
    const int64_t t = int64_t(targets[r]) - vocab_start;
    for (int64_t c = 0; c < cols; ++c) {
      double p = std::exp(double(z[c]) - lse);
      d[c] = float((p - (c == t ? 1.0 : 0.0)) * grad_scale);
    }
  }
}

void mse(const float* pred, const float* target, float grad_scale, float* losses, float* dpred, int64_t rows,
         int64_t k) {
#pragma omp parallel for schedule(static) if (rows * k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t i = 0; i < k; ++i) {
      double e = double(pred[r * k + i]) - target[r * k + i];
      s += e * e;
      if (dpred) dpred[r * k + i] = float(2.0 * e / double(k) * grad_scale);
    }
    losses[r] = float(s / double(k));
  }
}

void argmax(const float* logits, int32_t* out, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    out[r] = static_cast<int32_t>(best);
  }
}

}  // namespace relay::cpu
