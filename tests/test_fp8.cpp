// FP8 on the CPU backend (the reference for every CUDA FP8 kernel): the quantiser's scales and codes for each
// tiling (tensorwise; DeepSeek-V3's 1 x 128, 128 x 1 and 128 x 128 tiles, with partial edge tiles), its all-zero,
// inf / NaN and tiny-amax cases, and the emulated FP8 GEMM against an fp64 reference over the same quantised
// operands, every transpose, shapes off every tile and block edge. (The conversions themselves are checked against
// PyTorch's float8 casts by tests/torch/test_fp8_casts.py.)
//
// Reference and tolerance: ref (i, j) = sum over k of (a code's value * its tile's scale) * (b's likewise) in double,
// the dequantised operands' exact product, computed without knowing the k blocks. The emulation sums each block in
// f32 and scales it, so |y - ref| <= (k block + number of blocks + 3) * 2^-24 * sum over k of |a * b| (the f32
// rounding bound of those sums and the scale products); a scale applied to the wrong block misses by far more.
#include <cstring>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "core/fp8.hpp"
#include "core/fp8_scaling.hpp"
#include "core/rng.hpp"
#include "kernels/fp8_lt_layout.hpp"

namespace relay {
namespace {

constexpr Fp8Format kE4m3 = Fp8Format::e4m3, kE5m2 = Fp8Format::e5m2;

struct Quantised {
  Tensor q, scales;  // (rows, cols) codes, (grid rows, grid cols) f32
  Fp8Tiling tiling;
};

// A (rows, cols) f32 matrix of normal values, each 128 x 128 region (and each 1 x 128 stretch) at its own power of
// two between 2^-6 and 2^6, so that every tile gets a scale of its own.
Tensor random_matrix(Backend& be, int64_t rows, int64_t cols, uint64_t seed) {
  Tensor x(be, {rows, cols});
  Rng rng(seed, 0);
  std::vector<double> level(64);
  for (double& l : level) l = std::ldexp(1.0, int(rng.below(13)) - 6);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x.f32()[r * cols + c] = float(rng.normal() * level[size_t((r / 128 * 7 + c / 128 * 3 + r % 5) % 64)]);
  return x;
}

Quantised quantise(Backend& be, const Tensor& x, Fp8Tiling tiling, Fp8Format fmt) {
  const Fp8Grid g = fp8_grid(tiling, x.size(0), x.size(1));
  Quantised out{Tensor(be, x.shape(), fp8_dtype(fmt)), Tensor(be, {g.rows, g.cols}), tiling};
  be.fp8_quantize(x, tiling, out.q, out.scales);
  return out;
}

// The dequantised matrix (rows, cols) as stored: each code's value times its tile's scale, in double (exact).
std::vector<double> dequantised(const Quantised& x) {
  const int64_t rows = x.q.size(0), cols = x.q.size(1);
  const Fp8Grid g = fp8_grid(x.tiling, rows, cols);
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(r * cols + c)] = double(fp8_to_f32(x.q.fp8()[r * cols + c], fp8_format(x.q.dtype()))) *
                                  double(x.scales.f32()[(r / g.tile_rows) * g.cols + c / g.tile_cols]);
  return out;
}

void expect_codes(const Tensor& x, const Quantised& qx);

// Every tile's scale is its amax / max finite (computed here by brute force over the tile), and every code is
// f32_to_fp8(x / scale).
void expect_scales_and_codes(const Tensor& x, const Quantised& qx) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Fp8Format fmt = fp8_format(qx.q.dtype());
  const Fp8Grid g = fp8_grid(qx.tiling, rows, cols);
  ASSERT_EQ(qx.scales.shape(), (Shape{g.rows, g.cols}));
  for (int64_t gi = 0; gi < g.rows; ++gi)
    for (int64_t gj = 0; gj < g.cols; ++gj) {
      float amax = 0;
      for (int64_t r = gi * g.tile_rows; r < std::min(rows, (gi + 1) * g.tile_rows); ++r)
        for (int64_t c = gj * g.tile_cols; c < std::min(cols, (gj + 1) * g.tile_cols); ++c)
          amax = std::max(amax, std::fabs(x.f32()[r * cols + c]));
      const float want = amax == 0 ? 1.f : amax / fp8_spec(fmt).max_finite;
      ASSERT_EQ(qx.scales.f32()[gi * g.cols + gj], want) << fp8_tiling_name(qx.tiling) << " tile (" << gi << ", " << gj << ")";
    }
  expect_codes(x, qx);
}

// Every code is f32_to_fp8(x / its tile's scale).
void expect_codes(const Tensor& x, const Quantised& qx) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const Fp8Format fmt = fp8_format(qx.q.dtype());
  const Fp8Grid g = fp8_grid(qx.tiling, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = qx.scales.f32()[(r / g.tile_rows) * g.cols + c / g.tile_cols];
      ASSERT_EQ(qx.q.fp8()[r * cols + c], f32_to_fp8(x.f32()[r * cols + c] / s, fmt)) << "(" << r << ", " << c << ")";
    }
}

TEST(Fp8Quantize, TensorwiseScaleIsAmaxOverMaxFinite) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  Tensor x = random_matrix(*be, 5, 7, 1);
  x.f32()[17] = -300.f;  // the amax
  for (Fp8Format fmt : {kE4m3, kE5m2}) {
    const Quantised qx = quantise(*be, x, Fp8Tiling::tensor, fmt);
    EXPECT_EQ(qx.scales.f32()[0], 300.f / fp8_spec(fmt).max_finite);
    EXPECT_EQ(qx.q.fp8()[17], 0x80 | fp8_spec(fmt).max_code) << "the amax lands on -max finite";
    expect_scales_and_codes(x, qx);
  }
}

TEST(Fp8Quantize, TilesWithPartialEdgeTiles) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const std::vector<std::tuple<Fp8Tiling, int64_t, int64_t, Shape>> cases = {
      {Fp8Tiling::row_1x128, 3, 257, {3, 3}},        {Fp8Tiling::col_128x1, 257, 3, {3, 3}},
      {Fp8Tiling::block_128x128, 130, 129, {2, 2}},  {Fp8Tiling::block_128x128, 1, 1, {1, 1}},
      {Fp8Tiling::row_1x128, 2, 128, {2, 1}},        {Fp8Tiling::tensor, 130, 129, {1, 1}}};
  for (const auto& [tiling, rows, cols, grid] : cases)
    for (Fp8Format fmt : {kE4m3, kE5m2}) {
      Tensor x = random_matrix(*be, rows, cols, 2);
      const Quantised qx = quantise(*be, x, tiling, fmt);
      ASSERT_EQ(qx.scales.shape(), grid) << fp8_tiling_name(tiling);
      expect_scales_and_codes(x, qx);
    }
}

// fp8_amax then fp8_quantize_amax (the tensor-parallel path: an amax agreed over the group between the two passes):
// with the tiles' own amaxes it is fp8_quantize, codes and scales; with larger given amaxes (twice each: a larger
// amax elsewhere in the group), the scales are those amaxes' and each code is x / that tile's given scale.
TEST(Fp8Quantize, AmaxThenCodesIsQuantise) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  for (Fp8Tiling tiling : {Fp8Tiling::tensor, Fp8Tiling::row_1x128, Fp8Tiling::block_128x128})
    for (Fp8Format fmt : {kE4m3, kE5m2}) {
      Tensor x = random_matrix(*be, 130, 257, 5);
      const Quantised qx = quantise(*be, x, tiling, fmt);
      Tensor amax(*be, qx.scales.shape(), DType::i32);  // (grid) |x|'s max as float bits
      be->fp8_amax(x, tiling, amax);
      for (int64_t i = 0; i < amax.numel(); ++i)
        ASSERT_EQ(fp8_scale(uint32_t(amax.i32()[i]), fmt), qx.scales.f32()[i]) << fp8_tiling_name(tiling) << " " << i;
      Tensor q(*be, {130, 257}, qx.q.dtype()), scales(*be, qx.scales.shape());  // (rows, cols), (grid)
      be->fp8_quantize_amax(x, tiling, amax, q, scales);
      for (int64_t i = 0; i < q.numel(); ++i) ASSERT_EQ(q.fp8()[i], qx.q.fp8()[i]) << fp8_tiling_name(tiling) << " " << i;
      for (int64_t i = 0; i < scales.numel(); ++i) ASSERT_EQ(scales.f32()[i], qx.scales.f32()[i]);
      for (int64_t i = 0; i < amax.numel(); ++i) {  // twice each amax (exact in f32)
        float a;
        std::memcpy(&a, &amax.i32()[i], 4);
        a *= 2;
        std::memcpy(&amax.i32()[i], &a, 4);
      }
      be->fp8_quantize_amax(x, tiling, amax, q, scales);
      for (int64_t i = 0; i < scales.numel(); ++i) ASSERT_EQ(scales.f32()[i], 2 * qx.scales.f32()[i]);
      Quantised given{q, scales, tiling};
      expect_codes(x, given);
    }
}

TEST(Fp8Quantize, AllZeroTilesHaveScaleOne) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  Tensor x = random_matrix(*be, 2, 300, 3);
  for (int64_t c = 128; c < 256; ++c) x.f32()[c] = 0.f;  // tile (0, 1)
  const Quantised qx = quantise(*be, x, Fp8Tiling::row_1x128, kE4m3);
  EXPECT_EQ(qx.scales.f32()[1], 1.f);
  for (int64_t c = 128; c < 256; ++c) EXPECT_EQ(qx.q.fp8()[c], 0);
  expect_scales_and_codes(x, qx);
  Tensor zeros(*be, {4, 4});
  be->fill(zeros, 0.f);
  EXPECT_EQ(quantise(*be, zeros, Fp8Tiling::tensor, kE5m2).scales.f32()[0], 1.f);
}

// An inf or NaN keeps its tile's scale at 1 (never inf, 0 or NaN), stays non-finite in the codes, leaves the other
// tiles alone, and makes exactly the GEMM outputs that read it non-finite: what train.skip_nonfinite looks for.
TEST(Fp8Quantize, InfAndNanStayVisible) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Format fmt : {kE4m3, kE5m2}) {
    Tensor x(*be, {3, 256});
    be->fill(x, 0.5f);
    x.f32()[0] = inf;          // row 0, tile 0
    x.f32()[1] = 1e5f;         // beside it: saturates under the scale of 1
    x.f32()[256 + 5] = nan;    // row 1, tile 0
    x.f32()[512 + 200] = -inf; // row 2, tile 1
    const Quantised qx = quantise(*be, x, Fp8Tiling::row_1x128, fmt);
    const float* s = qx.scales.f32();  // (3, 2)
    EXPECT_EQ(s[0], 1.f);
    EXPECT_EQ(s[2], 1.f);
    EXPECT_EQ(s[5], 1.f);
    EXPECT_EQ(s[1], 0.5f / fp8_spec(fmt).max_finite) << "a tile without inf keeps its own scale";
    const uint8_t* q = qx.q.fp8();
    EXPECT_EQ(q[1], fp8_spec(fmt).max_code);
    if (fmt == kE4m3) {
      EXPECT_TRUE(std::isnan(fp8_to_f32(q[0], fmt)));
      EXPECT_TRUE(std::isnan(fp8_to_f32(q[512 + 200], fmt)));
    } else {
      EXPECT_EQ(fp8_to_f32(q[0], fmt), inf);
      EXPECT_EQ(fp8_to_f32(q[512 + 200], fmt), -inf);
    }
    EXPECT_TRUE(std::isnan(fp8_to_f32(q[256 + 5], fmt)));

    const Quantised tensorwise = quantise(*be, x, Fp8Tiling::tensor, fmt);
    EXPECT_EQ(tensorwise.scales.f32()[0], 1.f);

    Tensor ones(*be, {2, 256});  // (n, k)
    be->fill(ones, 1.f);
    const Quantised qw = quantise(*be, ones, Fp8Tiling::block_128x128, kE4m3);
    Tensor y(*be, {3, 2});
    be->fp8_matmul(qx.q, qx.scales, qx.tiling, false, qw.q, qw.scales, qw.tiling, true, y, 0.f);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 2; ++j) EXPECT_FALSE(std::isfinite(y.f32()[i * 2 + j])) << "row " << i;
    Tensor clean(*be, {1, 256});
    be->fill(clean, 0.25f);
    const Quantised qc = quantise(*be, clean, Fp8Tiling::row_1x128, fmt);
    Tensor yc(*be, {1, 2});
    be->fp8_matmul(qc.q, qc.scales, qc.tiling, false, qw.q, qw.scales, qw.tiling, true, yc, 0.f);
    EXPECT_NEAR(yc.f32()[0], 64.f, 1e-4f);
  }
}

TEST(Fp8Quantize, TinyAmaxKeepsTheScaleNormal) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  Tensor x(*be, {2, 3});
  be->fill(x, 1e-42f);  // a float subnormal: amax / 448 would underflow to 0 and x / 0 to inf
  for (Fp8Format fmt : {kE4m3, kE5m2}) {
    const Quantised qx = quantise(*be, x, Fp8Tiling::tensor, fmt);
    EXPECT_EQ(qx.scales.f32()[0], FLT_MIN);
    for (int i = 0; i < 6; ++i) EXPECT_TRUE(std::isfinite(fp8_to_f32(qx.q.fp8()[i], fmt)));
  }
}

struct GemmCase {
  int64_t m, n, k;
};
const std::vector<GemmCase> kShapes = {{1, 1, 1}, {130, 129, 257}, {3, 200, 128}, {129, 2, 385}, {17, 131, 130}};

// One recipe: how each operand is tiled given whether the GEMM transposes it, and their formats.
struct Recipe {
  const char* name;
  Fp8Tiling (*a_tiling)(bool trans_a);
  Fp8Tiling (*b_tiling)(bool trans_b);
  Fp8Format a_format, b_format;
};
Fp8Tiling tensorwise(bool) { return Fp8Tiling::tensor; }
Fp8Tiling along_k_of_a(bool trans) { return trans ? Fp8Tiling::col_128x1 : Fp8Tiling::row_1x128; }  // a (m, k)
Fp8Tiling along_k_of_b(bool trans) { return trans ? Fp8Tiling::row_1x128 : Fp8Tiling::col_128x1; }  // b (k, n)
Fp8Tiling blocks(bool) { return Fp8Tiling::block_128x128; }
const std::vector<Recipe> kRecipes = {
    {"tensorwise e4m3 x e4m3 (forward)", tensorwise, tensorwise, kE4m3, kE4m3},
    {"tensorwise e5m2 x e4m3 (input gradient)", tensorwise, tensorwise, kE5m2, kE4m3},
    {"blockwise 1x128 x 128x128 (forward, input gradient)", along_k_of_a, blocks, kE4m3, kE4m3},
    {"blockwise 128x128 x 1x128", blocks, along_k_of_b, kE4m3, kE4m3},
    {"blockwise 1x128 x 1x128 (weight gradient)", along_k_of_a, along_k_of_b, kE4m3, kE4m3},
};

TEST(Fp8Matmul, EqualsFp64ReferenceEveryRecipeTransposeAndShape) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  int checked = 0;
  for (const Recipe& rc : kRecipes)
    for (const GemmCase& s : kShapes)
      for (bool trans_a : {false, true})
        for (bool trans_b : {false, true}) {
          SCOPED_TRACE(testing::Message() << rc.name << " m " << s.m << " n " << s.n << " k " << s.k << " trans_a "
                                          << trans_a << " trans_b " << trans_b);
          const Tensor a = trans_a ? random_matrix(*be, s.k, s.m, 10 + s.m) : random_matrix(*be, s.m, s.k, 10 + s.m);
          const Tensor b = trans_b ? random_matrix(*be, s.n, s.k, 20 + s.n) : random_matrix(*be, s.k, s.n, 20 + s.n);
          const Quantised qa = quantise(*be, a, rc.a_tiling(trans_a), rc.a_format);
          const Quantised qb = quantise(*be, b, rc.b_tiling(trans_b), rc.b_format);
          Tensor y(*be, {s.m, s.n}), y_acc(*be, {s.m, s.n}), y_bf16(*be, {s.m, s.n}, DType::bf16);
          for (int64_t i = 0; i < s.m * s.n; ++i) y_acc.f32()[i] = float(i % 7) - 3.f;
          be->fp8_matmul(qa.q, qa.scales, qa.tiling, trans_a, qb.q, qb.scales, qb.tiling, trans_b, y, 0.f);
          be->fp8_matmul(qa.q, qa.scales, qa.tiling, trans_a, qb.q, qb.scales, qb.tiling, trans_b, y_acc, 1.f);
          be->fp8_matmul(qa.q, qa.scales, qa.tiling, trans_a, qb.q, qb.scales, qb.tiling, trans_b, y_bf16, 0.f);
          const bool blockwise = rc.a_tiling(trans_a) != Fp8Tiling::tensor && s.k > kFp8Tile;
          const int64_t kb = blockwise ? kFp8Tile : s.k, blocks_k = (s.k + kb - 1) / kb;
          const double u = std::ldexp(1.0, -24) * double(kb + blocks_k + 3);
          const std::vector<double> da = dequantised(qa), db = dequantised(qb);  // as stored
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j) {
              double ref = 0, abs_sum = 0;
              for (int64_t kk = 0; kk < s.k; ++kk) {
                const double p = da[size_t(trans_a ? kk * s.m + i : i * s.k + kk)] *
                                 db[size_t(trans_b ? j * s.k + kk : kk * s.n + j)];
                ref += p;
                abs_sum += std::fabs(p);
              }
              const float got = y.f32()[i * s.n + j];
              ASSERT_LE(std::fabs(got - ref), u * abs_sum + 1e-30) << "y (" << i << ", " << j << ")";
              const double want_acc = ref + (double(i * s.n + j) - 7 * double((i * s.n + j) / 7) - 3);
              ASSERT_LE(std::fabs(y_acc.f32()[i * s.n + j] - want_acc), u * abs_sum + std::ldexp(std::fabs(want_acc) + 4, -23))
                  << "beta 1: y (" << i << ", " << j << ")";
              ASSERT_EQ(y_bf16.b16()[i * s.n + j].bits, f32_to_bf16(got).bits) << "a bf16 y is the f32 y, rounded once";
              ++checked;
            }
        }
  EXPECT_GT(checked, 100000);
}

// Why blockwise: one outlier sets a tensorwise scale so large that the rest of the tensor falls into e4m3's
// subnormals and zero, while blockwise confines it to its own tile. Both against the unquantised f32 product.
TEST(Fp8Matmul, BlockwiseConfinesAnOutlierThatTensorwiseSpreads) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const int64_t m = 64, n = 32, k = 512;
  Tensor x = random_matrix(*be, m, k, 5), w = random_matrix(*be, n, k, 6);
  for (int64_t i = 0; i < m * k; ++i) x.f32()[i] = float(std::fmod(double(x.f32()[i]), 1.0));  // |x| < 1
  x.f32()[3] = 1e5f;
  Tensor exact(*be, {m, n});
  be->matmul(x, false, w, true, exact, 1.f, 0.f);
  auto error = [&](Fp8Tiling xt, Fp8Tiling wt) {
    const Quantised qx = quantise(*be, x, xt, kE4m3), qw = quantise(*be, w, wt, kE4m3);
    Tensor y(*be, {m, n});
    be->fp8_matmul(qx.q, qx.scales, xt, false, qw.q, qw.scales, wt, true, y, 0.f);
    double err = 0, norm = 0;
    for (int64_t i = 1; i < m; ++i)  // rows other than the outlier's
      for (int64_t j = 0; j < n; ++j) {
        err += std::pow(y.f32()[i * n + j] - exact.f32()[i * n + j], 2);
        norm += std::pow(exact.f32()[i * n + j], 2);
      }
    return std::sqrt(err / norm);
  };
  const double tensorwise = error(Fp8Tiling::tensor, Fp8Tiling::tensor);
  const double blockwise = error(Fp8Tiling::row_1x128, Fp8Tiling::block_128x128);
  EXPECT_LT(blockwise, 0.05) << "e4m3's 3 mantissa bits: a few percent";
  EXPECT_GT(tensorwise, 0.15) << "the outlier's scale (1e5 / 448 = 223) puts the rest of x (< 1) at e4m3's subnormals";
  EXPECT_GT(tensorwise, 4 * blockwise) << "blockwise " << blockwise;
}

TEST(Fp8Matmul, FrontDoorNamesTheMismatch) {
  auto be = make_backend(BackendOptions{Device::cpu, 1});
  const Tensor a = random_matrix(*be, 4, 257, 7), b = random_matrix(*be, 3, 257, 8);
  const Quantised qa = quantise(*be, a, Fp8Tiling::tensor, kE4m3);
  const Quantised qb = quantise(*be, b, Fp8Tiling::block_128x128, kE4m3);
  Tensor y(*be, {4, 3});
  EXPECT_EXIT(be->fp8_matmul(qa.q, qa.scales, qa.tiling, false, qb.q, qb.scales, qb.tiling, true, y, 0.f),
              ::testing::ExitedWithCode(1), "fp8_matmul: a's scales \\(tensorwise\\) and b's \\(128 x 128 blocks, "
                                            "transposed\\) do not share blocks along k = 257");
  EXPECT_EXIT(be->fp8_matmul(qa.q, qa.scales, Fp8Tiling::row_1x128, false, qb.q, qb.scales, qb.tiling, true, y, 0.f),
              ::testing::ExitedWithCode(1), "fp8_matmul: a_scales \\[1, 1\\] for 1 x 128 tiles of a \\[4, 257\\], "
                                            "expected \\[4, 3\\]");
  Tensor q_wrong(*be, {4, 257}, DType::bf16), s(*be, {1, 1});
  EXPECT_EXIT(be->fp8_quantize(a, Fp8Tiling::tensor, q_wrong, s), ::testing::ExitedWithCode(1),
              "fp8_quantize: q \\[4, 257\\] is bfloat16, expected float8");
}

// --- the cuBLASLt FP8 GEMM's host-side plan (kernels/fp8_lt_layout.hpp) ----------------------------------------------
// The CUDA backend asks fp8_lt_plan whether a GEMM runs on cuBLASLt and with which transposed copies and scale
// layouts; these checks need no GPU. The layouts cuBLASLt itself reads are checked on a GPU (test_backend_ops'
// fp8_lt rows).

Fp8LtProblem lt_problem(int64_t m, int64_t n, int64_t k, Fp8Tiling at, Fp8Tiling bt, bool ta, bool tb, int sm = 90,
                        Fp8Format af = kE4m3, Fp8Format bf = kE4m3) {
  Fp8LtProblem p;
  p.m = m, p.n = n, p.k = k, p.a_tiling = at, p.b_tiling = bt, p.trans_a = ta, p.trans_b = tb, p.sm = sm;
  p.a_format = af, p.b_format = bf, p.alignment = 256;
  return p;
}

// Which GEMMs go to cuBLASLt, and which copies they need: Fp8Linear's forward (x @ W^T) none, its input gradient
// (dy @ W) W transposed, its weight gradient (dy^T @ x) both; anything cuBLASLt cannot take names its reason.
TEST(Fp8LtPlan, ChoosesCuBlasLtOrThePlainKernel) {
  const Fp8Tiling T = Fp8Tiling::tensor, R = Fp8Tiling::row_1x128, C = Fp8Tiling::col_128x1,
                  B = Fp8Tiling::block_128x128;
  struct Gemm { bool ta, tb; bool copy_a, copy_b; };
  for (const Gemm g : {Gemm{false, true, false, false}, Gemm{false, false, false, true}, Gemm{true, false, true, true},
                       Gemm{true, true, true, false}}) {
    const Fp8LtPlan p = fp8_lt_plan(lt_problem(256, 512, 1024, T, T, g.ta, g.tb, 90, kE5m2, kE4m3));
    EXPECT_TRUE(p.lt) << p.reason;
    EXPECT_EQ(p.a.transpose, g.copy_a) << g.ta << g.tb;
    EXPECT_EQ(p.b.transpose, g.copy_b) << g.ta << g.tb;
    EXPECT_EQ(p.a.scale, Fp8LtScale::scalar);
    EXPECT_FALSE(p.a.scales_copy || p.b.scales_copy);
  }
  // Blockwise: the forward's x (1 x 128) times W (128 x 128), the weight gradient's dy^T, x (128 x 1 along k).
  Fp8LtPlan fwd = fp8_lt_plan(lt_problem(256, 512, 1024, R, B, false, true));
  ASSERT_TRUE(fwd.lt) << fwd.reason;
  EXPECT_EQ(fwd.a.scale, Fp8LtScale::vec128);
  EXPECT_TRUE(fwd.a.scales_transpose);  // Relay's (tokens, k blocks) -> cuBLASLt's (k blocks, tokens)
  EXPECT_EQ(fwd.b.scale, Fp8LtScale::blk128x128);
  EXPECT_FALSE(fwd.b.scales_copy);  // 8 k blocks: already a multiple of 4
  Fp8LtPlan wgrad = fp8_lt_plan(lt_problem(512, 256, 4096, C, C, true, false));
  ASSERT_TRUE(wgrad.lt) << wgrad.reason;
  EXPECT_TRUE(wgrad.a.transpose && wgrad.b.transpose);
  EXPECT_FALSE(wgrad.a.scales_copy || wgrad.b.scales_copy);  // 128 x 1 tiles of dy are 1 x 128 tiles of dy^T
  Fp8LtPlan padded = fp8_lt_plan(lt_problem(256, 512, 272, R, B, false, false));  // dy @ W, 3 k blocks
  ASSERT_TRUE(padded.lt) << padded.reason;
  EXPECT_TRUE(padded.b.transpose && padded.b.scales_transpose);
  EXPECT_EQ(padded.b.scales_rows, 4);  // W^T (512, 272): 4 row blocks of 3 k blocks, padded to 4
  EXPECT_EQ(padded.b.scales_cols, 3);
  EXPECT_EQ(padded.b.scales_ld, 4);
  // The plain kernel, and why.
  auto reason = [](const Fp8LtProblem& p) { return std::string(fp8_lt_plan(p).reason); };
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, T, T, false, true, 80)), "cuBLASLt FP8 GEMMs need sm_89 or newer");
  EXPECT_TRUE(fp8_lt_plan(lt_problem(256, 512, 1024, T, T, false, true, 89)).lt);  // Ada: tensorwise
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, R, B, false, true, 89)),
            "cuBLASLt's 1 x 128 / 128 x 128 scale modes are Hopper's (sm_90)");
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, R, B, false, true, 100)),
            "cuBLASLt's 1 x 128 / 128 x 128 scale modes are Hopper's (sm_90)");
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, T, T, false, true, 90, kE5m2, kE5m2)),
            "cuBLASLt has no e5m2 x e5m2 FP8 GEMM");
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, R, B, false, true, 90, kE5m2, kE4m3)),
            "cuBLASLt's block scale modes take e4m3 operands");
  for (const Fp8LtProblem& p : {lt_problem(130, 512, 1024, T, T, false, true), lt_problem(256, 67, 1024, T, T, false, true),
                                lt_problem(256, 512, 260, T, T, false, true), lt_problem(0, 512, 1024, T, T, false, true)})
    EXPECT_EQ(reason(p), "m, n and k must be non-zero multiples of 16") << p.m << " " << p.n << " " << p.k;
  Fp8LtProblem misaligned = lt_problem(256, 512, 1024, T, T, false, true);
  misaligned.alignment = 8;  // a view at an odd row of a bf16 y, say
  EXPECT_EQ(reason(misaligned), "an operand is not 16-byte aligned");
  EXPECT_EQ(reason(lt_problem(256, 512, 64, T, B, false, true)), "a per-tensor scale with a block-scaled operand");
  EXPECT_EQ(reason(lt_problem(256, 512, 1024, B, B, false, true)),
            "cuBLASLt has no 128 x 128 x 128 x 128 block scale mode");
}

// The scale cuBLASLt reads for every element of op(a) and op(b), through the plan's relaid copy and cuBLASLt's
// layouts (VEC128: (k blocks, outer) with the outer dimension contiguous; BLK128x128: (outer blocks, k blocks padded
// to 4); the scalar), is the scale of Relay's tile holding that element: every tiling the blockwise recipe makes,
// every transpose, k on and off the 128 edge, outer dimensions of one and several blocks.
TEST(Fp8LtPlan, RelaidScalesAreEachElementsTileScale) {
  const Fp8Tiling T = Fp8Tiling::tensor, R = Fp8Tiling::row_1x128, C = Fp8Tiling::col_128x1,
                  B = Fp8Tiling::block_128x128;
  // fp8_scales_relayout's rule (kernels/cuda/fp8_transpose.cuh), on the host.
  auto relayout = [](const std::vector<float>& s, int64_t s_rows, int64_t s_cols, const Fp8LtOperand& op) {
    if (!op.scales_copy) return s;
    const int64_t rows = op.scales_transpose ? s_cols : s_rows, cols = op.scales_transpose ? s_rows : s_cols;
    EXPECT_EQ(rows, op.scales_rows);
    EXPECT_EQ(cols, op.scales_cols);
    std::vector<float> out(size_t(rows * op.scales_ld));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < op.scales_ld; ++j)
        out[size_t(i * op.scales_ld + j)] =
            j >= cols ? 0.f : op.scales_transpose ? s[size_t(j * s_cols + i)] : s[size_t(i * s_cols + j)];
    return out;
  };
  // The scale cuBLASLt applies to element (outer o, k kk) of an operand read as (outer, k): its layouts, written out
  // from the operand's dimensions alone (not from the plan's).
  auto lt_scale = [](const std::vector<float>& s, Fp8LtScale mode, int64_t outer, int64_t k, int64_t o, int64_t kk) {
    switch (mode) {
      case Fp8LtScale::scalar: return s[0];
      case Fp8LtScale::vec128: return s[size_t((kk / 128) * outer + o)];
      case Fp8LtScale::blk128x128: return s[size_t((o / 128) * fp8_round_up((k + 127) / 128, 4) + kk / 128)];
    }
    return -1.f;
  };
  struct Case { Fp8Tiling at, bt; };
  int checked = 0;
  for (const Case c : {Case{T, T}, Case{R, B}, Case{C, B}, Case{R, R}, Case{C, C}, Case{R, C}, Case{C, R}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t k : {256, 272, 64})
          for (auto [m, n] : {std::pair<int64_t, int64_t>{48, 160}, {272, 32}}) {
            const Fp8LtPlan plan = fp8_lt_plan(lt_problem(m, n, k, c.at, c.bt, ta, tb));
            // A tiling along k only: 1 x 128 when k runs along the columns as stored, 128 x 1 along the rows.
            const bool a_ok = c.at == T || c.at == (ta ? C : R);
            const bool b_ok = c.bt == T || c.bt == B || c.bt == (tb ? R : C);
            ASSERT_EQ(plan.lt, a_ok && b_ok) << plan.reason;
            if (!plan.lt) continue;
            const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
            const Fp8Grid ga = fp8_grid(c.at, ar, ac), gb = fp8_grid(c.bt, br, bc);
            std::vector<float> sa(size_t(ga.rows * ga.cols)), sb(size_t(gb.rows * gb.cols));
            for (size_t i = 0; i < sa.size(); ++i) sa[i] = float(i + 1);  // every tile's scale distinct
            for (size_t i = 0; i < sb.size(); ++i) sb[i] = float(1000 + i);
            const std::vector<float> la = relayout(sa, ga.rows, ga.cols, plan.a), lb = relayout(sb, gb.rows, gb.cols, plan.b);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t kk = 0; kk < k; ++kk) {  // op(a) (i, kk): a stored (kk, i) when trans_a
                const int64_t r = ta ? kk : i, col = ta ? i : kk;
                ASSERT_EQ(lt_scale(la, plan.a.scale, m, k, i, kk), sa[size_t((r / ga.tile_rows) * ga.cols + col / ga.tile_cols)])
                    << "a " << fp8_tiling_name(c.at) << " ta " << ta << " m " << m << " k " << k << " at (" << i << ", " << kk << ")";
              }
            for (int64_t j = 0; j < n; ++j)
              for (int64_t kk = 0; kk < k; ++kk) {  // op(b) (kk, j): b stored (j, kk) when trans_b
                const int64_t r = tb ? j : kk, col = tb ? kk : j;
                ASSERT_EQ(lt_scale(lb, plan.b.scale, n, k, j, kk), sb[size_t((r / gb.tile_rows) * gb.cols + col / gb.tile_cols)])
                    << "b " << fp8_tiling_name(c.bt) << " tb " << tb << " n " << n << " k " << k << " at (" << kk << ", " << j << ")";
              }
            ++checked;
          }
  EXPECT_GT(checked, 50);
}

}  // namespace
}  // namespace relay
