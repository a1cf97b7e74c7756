// Rotary position embedding (Su et al., arXiv:2104.09864) as transformers applies it to Llama's queries
// and keys: the rotate-half pairing (i, i + hd/2) within each head. float or bf16 storage, float math,
// one rounding per output. The cos/sin table is built once per call for the distinct positions, with YaRN's
// frequencies and factor when scaling is on (kernels/rope_angles.hpp). rotary_columns: the regrouping of the rotary
// columns DeepSeek-V3's MLA rotates (transformers' apply_rotary_pos_emb_interleave), a permutation, no arithmetic.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/rope_angles.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X>
RELAY_CPU_CLONES
void rope(const X* x, X* y, int64_t rows, int64_t T, int64_t heads, int64_t hd, double theta, int64_t pos0,
          bool inverse, const int32_t* row_pos, const RopeScaling& scaling) {
  // The angles of positions pos0 .. pos0 + positions - 1, rows reading theirs: row r % T, or row_pos[r] < T.
  const int64_t half = hd / 2, positions = row_pos ? T : std::min(rows, T);
  std::vector<float> cs(static_cast<size_t>(positions * half)), sn(cs.size());  // (positions, hd/2)
#pragma omp parallel for schedule(static) if (positions * half > 4096)
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      float c, s;
      rope_cos_sin(pos0 + p, i, hd, theta, scaling, c, s);
      cs[size_t(p * half + i)] = c;
      sn[size_t(p * half + i)] = inverse ? -s : s;
    }
  const int64_t cols = heads * hd;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = row_pos ? int64_t(row_pos[r]) : r % T;
    const float* c = cs.data() + p * half;
    const float* s = sn.data() + p * half;
    for (int64_t h = 0; h < heads; ++h) {
      const X* xr = x + r * cols + h * hd;
      X* yr = y + r * cols + h * hd;  // may be xr: both halves are read before either is written
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = load(xr[i]), b = load(xr[i + half]);
        store(yr[i], a * c[i] - b * s[i]);
        store(yr[i + half], b * c[i] + a * s[i]);
      }
    }
  }
}

#define INST(X) \
  template void rope<X>(const X*, X*, int64_t, int64_t, int64_t, int64_t, double, int64_t, bool, const int32_t*, \
                        const RopeScaling&);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

template <typename X>
void rotary_columns(const X* src, X* dst, int64_t rows, int64_t heads, int64_t w, int64_t off, int64_t dr,
                    bool interleaved, bool gather) {
  const int64_t half = dr / 2;
#pragma omp parallel for schedule(static) if (rows * heads * dr > kParallelElems)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t xo = r * heads * w + h * w + off, po = (r * heads + h) * dr;  // this head's rotary columns
      for (int64_t j = 0; j < dr; ++j) {
        // pe column j <-> x column: 2j (j < dr/2) or 2 (j - dr/2) + 1 interleaved, else j
        const int64_t xj = !interleaved ? j : j < half ? 2 * j : 2 * (j - half) + 1;
        if (gather) dst[po + j] = src[xo + xj];
        else dst[xo + xj] = src[po + j];
      }
    }
}

#define INST(X) \
  template void rotary_columns<X>(const X*, X*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
