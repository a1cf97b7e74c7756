// FP8 quantisation: tile amaxes (as |x|'s bits, an exact and order-free max) then codes. Blockwise tilings in one
// pass over memory, 128 x 128 panels each read from memory once and from cache twice; tensorwise in two passes over
// the matrix, each also an op of its own, so that ranks holding shards can agree on an amax between them.
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

namespace {

// Tiles of 1 x 128, 128 x 1 or 128 x 128 in one pass over memory: the matrix as panels of 128 x 128 elements (64 KiB
// of f32 at most, held in the core's cache), each holding whole tiles (128 of 1 x 128 or of 128 x 1, or one block);
// a panel's tile amaxes, then its codes from the same, cached, elements. The same amaxes, scales and codes as the two
// passes over the whole matrix: the max is exact and order-free, each code depends on its element and its tile's scale.
template <typename X>
void fp8_quantize_panels(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint8_t* q,
                         float* scales) {
  const Fp8Grid g = fp8_grid(tiling, rows, cols);
  const bool per_row = g.tile_rows == 1, per_col = g.tile_cols == 1;  // 1 x 128: a tile a row; 128 x 1: a column
  const int64_t bands = (rows + kFp8Tile - 1) / kFp8Tile, strips = (cols + kFp8Tile - 1) / kFp8Tile;
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > 65536)
  for (int64_t bi = 0; bi < bands; ++bi)
    for (int64_t bj = 0; bj < strips; ++bj) {
      const int64_t r0 = bi * kFp8Tile, r1 = std::min(rows, r0 + kFp8Tile);
      const int64_t c0 = bj * kFp8Tile, c1 = std::min(cols, c0 + kFp8Tile);
      // The panel's tiles, (panel rows or 1) x (panel cols or 1), at most 128: tile (r, c) of the panel is
      // t(r, c) = (per_row ? r - r0 : 0) + (per_col ? c - c0 : 0) (never both), amax and scale at [t].
      uint32_t amax[kFp8Tile] = {};  // (tiles) |x|'s max as float bits
      float s[kFp8Tile];             // (tiles) their scales
      for (int64_t r = r0; r < r1; ++r) {
        const X* xr = x + r * cols;
        uint32_t* m = amax + (per_row ? r - r0 : 0);
        if (per_col)
          for (int64_t c = c0; c < c1; ++c) m[c - c0] = std::max(m[c - c0], fp8_abs_bits(load(xr[c])));
        else
          for (int64_t c = c0; c < c1; ++c) m[0] = std::max(m[0], fp8_abs_bits(load(xr[c])));
      }
      const int64_t tiles = per_row ? r1 - r0 : per_col ? c1 - c0 : 1;
      for (int64_t t = 0; t < tiles; ++t) {
        s[t] = fp8_scale(amax[t], fmt);
        // grid (r / tile_rows, c / tile_cols) of the tile's first element
        const int64_t gr = per_row ? r0 + t : r0 / g.tile_rows, gc = per_col ? c0 + t : c0 / g.tile_cols;
        scales[gr * g.cols + gc] = s[t];
      }
      for (int64_t r = r0; r < r1; ++r) {
        const X* xr = x + r * cols;
        uint8_t* qr = q + r * cols;
        const float* sr = s + (per_row ? r - r0 : 0);
        if (per_col)
          for (int64_t c = c0; c < c1; ++c) qr[c] = fp8_quantize_value(load(xr[c]), sr[c - c0], fmt);
        else
          for (int64_t c = c0; c < c1; ++c) qr[c] = fp8_quantize_value(load(xr[c]), sr[0], fmt);
      }
    }
}

}  // namespace

template <typename X>
void fp8_quantize(const X* x, int64_t rows, int64_t cols, Fp8Tiling tiling, Fp8Format fmt, uint8_t* q, float* scales) {
  if (tiling != Fp8Tiling::tensor) return fp8_quantize_panels(x, rows, cols, tiling, fmt, q, scales);
  // Tensorwise: no code can be written before the whole tensor's amax is known, so the tensor is read twice (once
  // for the amax, once for the codes); one read would need the tensor held in cache, which a weight or an activation
  // is not.
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
