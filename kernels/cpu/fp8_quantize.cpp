// FP8 quantisation: two passes over the matrix, tile amaxes (as |x|'s bits, an exact and order-free max) then codes;
// each pass is also an op of its own, so that ranks holding shards can agree on an amax between them.
#include "kernels/cpu/fp8_quantize.hpp"

#include <algorithm>
#include <vector>

#include "kernels/cpu/instantiate.hpp"

namespace relay::cpu {

template <typename X>
void fp8_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, uint32_t* amax) {
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  std::fill(amax, amax + g.rows * g.cols, 0u);
  // Each grid row belongs to one thread; tensorwise (one grid row) splits the rows across threads and takes the max
  // of their maxima.
  if (g.rows == 1 && g.cols == 1) {
    uint32_t m = 0;
#pragma omp parallel for schedule(static) reduction(max : m) if (rows * cols > 65536)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, fp8_abs_bits(load(x[r * cols + c])));
    amax[0] = m;
  } else {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t gi = 0; gi < g.rows; ++gi) {
      uint32_t* grow = amax + gi * g.cols;  // (g.cols) this tile row's amaxes
      for (int64_t r = gi * g.tile_rows; r < std::min(rows, (gi + 1) * g.tile_rows); ++r)
        for (int64_t c = 0; c < cols; ++c) {
          uint32_t& m = grow[c / g.tile_cols];
          m = std::max(m, fp8_abs_bits(load(x[r * cols + c])));
        }
    }
  }
}

template <typename X>
void fp8_quantize_amax(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt,
                       const uint32_t* amax, uint8_t* q, float* scales) {
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  for (int64_t i = 0; i < g.rows * g.cols; ++i) scales[i] = fp8_scale(amax[i], fmt);
  fp8_quantize_with(x, rows, cols, tiling, fmt, scales, q);
}

template <typename X>
void fp8_quantize(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint8_t* q, float* scales) {
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  std::vector<uint32_t> amax(size_t(g.rows * g.cols));  // (g.rows, g.cols) as |x|'s bits
  fp8_amax(x, rows, cols, tiling, amax.data());                     // pass 1: the tiles' amaxes
  fp8_quantize_amax(x, rows, cols, tiling, fmt, amax.data(), q, scales);  // pass 2: scales and codes
}

template <typename X>
void fp8_quantize_with(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, const float* scales,
                       uint8_t* q) {
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scales + (r / g.tile_rows) * g.cols;  // (g.cols) the scales of this row's tiles
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = fp8_quantize_value(load(x[r * cols + c]), srow[c / g.tile_cols], fmt);
  }
}
#define INST_FP8_QUANTIZE(X)                                                                          \
  template void fp8_quantize<X>(const X*, int64_t, int64_t, Fp8Tiling, Fp8Format, uint8_t*, float*); \
  template void fp8_quantize_with<X>(const X*, int64_t, int64_t, Fp8Tiling, Fp8Format, const float*, uint8_t*); \
  template void fp8_amax<X>(const X*, int64_t, int64_t, Fp8Tiling, uint32_t*);                                 \
  template void fp8_quantize_amax<X>(const X*, int64_t, int64_t, Fp8Tiling, Fp8Format, const uint32_t*, uint8_t*, float*);
RELAY_FOR_FLOAT_TYPES(INST_FP8_QUANTIZE)

void fp8_widen(const uint8_t* in, int64_t n, Fp8Format fmt, float* out) {
  const float* value = fp8_table(fmt).value;  // (256)
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = value[in[i]];
}

}  // namespace relay::cpu
