// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance, eps inside the sqrt).
// Row statistics are accumulated in double so the reference is tighter than any GPU kernel it checks.
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += xr[i];
    double mu = s / double(d);
    double v = 0;
    for (int64_t i = 0; i < d; ++i) v += (xr[i] - mu) * (xr[i] - mu);
    double rs = 1.0 / std::sqrt(v / double(d) + double(eps));
    mean[r] = float(mu);
    rstd[r] = float(rs);
    float* yr = y + r * d;
    for (int64_t i = 0; i < d; ++i) yr[i] = float((xr[i] - mu) * rs) * gamma[i] + beta[i];
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), where g = dy * gamma.
void layernorm_backward_input(const float* dy, const float* x, const float* gamma, const float* mean,
                              const float* rstd, float* dx, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    double mu = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int64_t i = 0; i < d; ++i) {
      double g = double(dyr[i]) * gamma[i];
      sg += g;
      sgx += g * (xr[i] - mu) * rs;
    }
    sg /= double(d);
    sgx /= double(d);
    float* dxr = dx + r * d;
    for (int64_t i = 0; i < d; ++i) {
      double g = double(dyr[i]) * gamma[i];
      double xhat = (xr[i] - mu) * rs;
      dxr[i] = float(rs * (g - sg - xhat * sgx));
    }
  }
}

void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d > 32768)
  for (int64_t i = 0; i < d; ++i) {
    double sgm = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double xhat = (double(x[r * d + i]) - mean[r]) * rstd[r];
      sgm += double(dy[r * d + i]) * xhat;
      sb += dy[r * d + i];
    }
    dgamma[i] += float(sgm);
    dbeta[i] += float(sb);
  }
}

}  // namespace relay::cpu
