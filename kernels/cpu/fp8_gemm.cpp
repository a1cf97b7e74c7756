// FP8 GEMM emulation: the codes widened to float (exact), one sgemm per k block into a partial sum, each partial sum
// scaled by its blocks' a_scale * b_scale into a float accumulator, y written once.
#include "kernels/cpu/fp8_gemm.hpp"

#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/fp8_quantize.hpp"
#include "kernels/cpu/instantiate.hpp"

namespace relay::cpu {

template <typename Y>
void fp8_gemm(const Fp8Matrix& a, bool trans_a, const Fp8Matrix& b, bool trans_b, Y* y, float beta) {
  const int64_t m = trans_a ? a.cols : a.rows, k = trans_a ? a.rows : a.cols;
  const int64_t n = trans_b ? b.rows : b.cols;
  const int64_t kb = fp8_k_block(k, fp8_k_tile(a.tiling, a.rows, a.cols, trans_a),
                                 fp8_k_tile(b.tiling, b.rows, b.cols, !trans_b));
  RELAY_ASSERT(kb > 0, "fp8_gemm: a's scales (" << fp8_tiling_name(a.tiling) << ") and b's (" << fp8_tiling_name(b.tiling)
                                                << ") do not share k blocks over k = " << k);
  const Fp8Grid ga = fp8_grid(a.tiling, a.rows, a.cols), gb = fp8_grid(b.tiling, b.rows, b.cols);
  std::vector<float> av(size_t(a.rows * a.cols)), bv(size_t(b.rows * b.cols));  // a, b as stored, unscaled values
  fp8_widen(a.q, a.rows * a.cols, a.format, av.data());
  fp8_widen(b.q, b.rows * b.cols, b.format, bv.data());
  std::vector<float> acc(size_t(m * n), 0.f);      // (m, n) the scaled sum so far
  std::vector<float> partial(size_t(m * n));       // (m, n) one k block's unscaled sum
  std::vector<float> sa(static_cast<size_t>(m)), sb(static_cast<size_t>(n));  // (m), (n) the block's scale of each row of op(a), column of op(b)
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t len = std::min(kb, k - k0);
    // The block's columns k0.. of op(a): a's columns when a is (m, k), its rows when a is stored (k, m).
    const float* ab = trans_a ? av.data() + k0 * a.cols : av.data() + k0;
    const float* bb = trans_b ? bv.data() + k0 : bv.data() + k0 * b.cols;
    gemm(trans_a, trans_b, m, n, len, 1.f, ab, a.cols, bb, b.cols, 0.f, partial.data(), n);
    for (int64_t i = 0; i < m; ++i)
      sa[size_t(i)] = trans_a ? a.scales[(k0 / ga.tile_rows) * ga.cols + i / ga.tile_cols]
                              : a.scales[(i / ga.tile_rows) * ga.cols + k0 / ga.tile_cols];
    for (int64_t j = 0; j < n; ++j)
      sb[size_t(j)] = trans_b ? b.scales[(j / gb.tile_rows) * gb.cols + k0 / gb.tile_cols]
                              : b.scales[(k0 / gb.tile_rows) * gb.cols + j / gb.tile_cols];
#pragma omp parallel for schedule(static) if (m * n > 32768)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) acc[size_t(i * n + j)] += partial[size_t(i * n + j)] * (sa[size_t(i)] * sb[size_t(j)]);
  }
#pragma omp parallel for schedule(static) if (m * n > 32768)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      Y& out = y[i * n + j];
      store(out, beta == 0.f ? acc[size_t(i * n + j)] : acc[size_t(i * n + j)] + beta * load(out));
    }
}
#define INST_FP8_GEMM(Y) template void fp8_gemm<Y>(const Fp8Matrix&, bool, const Fp8Matrix&, bool, Y*, float);
RELAY_FOR_FLOAT_TYPES(INST_FP8_GEMM)

}  // namespace relay::cpu
