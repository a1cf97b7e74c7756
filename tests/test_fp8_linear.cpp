// model/fp8_linear.*: a linear layer's three GEMMs in FP8 against fp64 products of the unquantised operands. Each
// GEMM must quantise its operands along its own reduction dimension: under blockwise scaling rows (or columns) of
// very different magnitudes keep their own scales, which tensorwise scaling cannot (a row 2^-40 below the tensor's
// amax falls under the smallest subnormal relative to it and becomes zero).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/backend.hpp"
#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "core/error.hpp"
#include "model/family.hpp"
#include "model/fp8_linear.hpp"
#include "model/model_spec.hpp"
#include "support/test_support.hpp"

namespace relay {
namespace {

// (rows, cols) f32, normal values; row r scaled by row_scale(r), column c by col_scale(c).
template <typename R, typename C>
Tensor matrix(Backend& be, int64_t rows, int64_t cols, uint64_t seed, R row_scale, C col_scale) {
  Tensor x(be, {rows, cols});
  Rng rng(seed, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.f32()[r * cols + c] = float(rng.normal() * row_scale(r) * col_scale(c));
  return x;
}
const auto kOne = [](int64_t) { return 1.0; };

// ref (m, n) = op(a) @ op(b) in fp64.
std::vector<double> product(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1), n = tb ? b.size(0) : b.size(1);
  std::vector<double> y(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += double(ta ? a.f32()[p * a.size(1) + i] : a.f32()[i * a.size(1) + p]) *
             double(tb ? b.f32()[j * b.size(1) + p] : b.f32()[p * b.size(1) + j]);
      y[size_t(i * n + j)] = s;
    }
  return y;
}

// The relative L2 error of one row (by_rows) or one column of got against ref, the worst over rows or columns.
double worst_error(const Tensor& got, const std::vector<double>& ref, bool by_rows) {
  const int64_t m = got.size(0), n = got.size(1);
  double worst = 0;
  for (int64_t o = 0; o < (by_rows ? m : n); ++o) {
    double err = 0, norm = 0;
    for (int64_t i = 0; i < (by_rows ? n : m); ++i) {
      const int64_t at = by_rows ? o * n + i : i * n + o;
      err += std::pow(double(got.f32()[at]) - ref[size_t(at)], 2);
      norm += ref[size_t(at)] * ref[size_t(at)];
    }
    worst = std::max(worst, std::sqrt(err / norm));
  }
  return worst;
}

// n = 300 rows (three 128-row tiles along the weight gradient's K, the last partial), in 48, out 32.
constexpr int64_t kN = 300, kIn = 48, kOut = 32;

TEST(Fp8Linear, ThreeGemmsWithinFp8RoundingOfFp64) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const Tensor x = matrix(*be, kN, kIn, 1, kOne, kOne), w = matrix(*be, kOut, kIn, 2, kOne, kOne);
  const Tensor dy = matrix(*be, kN, kOut, 3, kOne, kOne);
  // e4m3 rounds to 2^-4 relative, e5m2 to 2^-3; random-sign sums keep the relative error of a whole row near one
  // element's. Measured, worst row or column (the inputs are fixed by their seeds): 0.054-0.064 with e4m3 operands,
  // 0.080-0.106 with tensorwise's e5m2 gradients; bounds 0.1 and 0.15, while a wrong transpose or operand gives an
  // error near 1.
  for (Fp8Recipe recipe : {Fp8Recipe::tensorwise, Fp8Recipe::blockwise}) {
    const Fp8Linear lin(recipe);
    const double grad_bound = recipe == Fp8Recipe::tensorwise ? 0.15 : 0.1;
    Tensor y(*be, {kN, kOut}), dx(*be, {kN, kIn}), dw(*be, {kOut, kIn});
    lin.linear(*be, x, w, Tensor(), y);
    lin.linear_backward_input(*be, dy, w, dx, LinearAct::none, Tensor());
    be->fill(dw, 0.f);
    lin.weight_grad(*be, dy, x, dw);
    const double ey = worst_error(y, product(x, false, w, true), true);
    const double edx = worst_error(dx, product(dy, false, w, false), true);
    const double edw = worst_error(dw, product(dy, true, x, false), true);
    EXPECT_LT(ey, 0.1) << fp8_recipe_name(recipe) << " forward";
    EXPECT_LT(edx, grad_bound) << fp8_recipe_name(recipe) << " dx";
    EXPECT_LT(edw, grad_bound) << fp8_recipe_name(recipe) << " dW";
    std::printf("%-10s worst row's relative error: forward %.3f, dx %.3f, dW %.3f\n", fp8_recipe_name(recipe), ey, edx,
                edw);
    // The weight gradient accumulates (beta 1): a second call doubles it (up to the order of f32 sums).
    std::vector<float> once(dw.f32(), dw.f32() + dw.numel());
    lin.weight_grad(*be, dy, x, dw);
    for (int64_t i = 0; i < dw.numel(); ++i)
      ASSERT_NEAR(dw.f32()[i], 2 * once[size_t(i)], 1e-5 * std::abs(once[size_t(i)]) + 1e-6) << i;
  }
}

TEST(Fp8Linear, BlockwiseScalesFollowEachGemmsReduction) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  // 2^-40: below the smallest subnormal of e4m3 and of e5m2 relative to the tensor's amax.
  const auto tiny_odd = [](int64_t i) { return i % 2 ? std::ldexp(1.0, -40) : 1.0; };
  // Forward and input gradient reduce along columns: odd rows of x and dy tiny. The weight gradient reduces along
  // rows: odd columns of x tiny (its 128 x 1 tiles are columns).
  const Tensor x_rows = matrix(*be, kN, kIn, 4, tiny_odd, kOne), dy_rows = matrix(*be, kN, kOut, 5, tiny_odd, kOne);
  const Tensor x_cols = matrix(*be, kN, kIn, 6, kOne, tiny_odd), dy = matrix(*be, kN, kOut, 7, kOne, kOne);
  const Tensor w = matrix(*be, kOut, kIn, 8, kOne, kOne);
  for (Fp8Recipe recipe : {Fp8Recipe::tensorwise, Fp8Recipe::blockwise}) {
    const Fp8Linear lin(recipe);
    Tensor y(*be, {kN, kOut}), dx(*be, {kN, kIn}), dw(*be, {kOut, kIn});
    lin.linear(*be, x_rows, w, Tensor(), y);
    lin.matmul(*be, dy_rows, w, false, dx);
    be->fill(dw, 0.f);
    lin.weight_grad(*be, dy, x_cols, dw);
    const double ey = worst_error(y, product(x_rows, false, w, true), true);
    const double edx = worst_error(dx, product(dy_rows, false, w, false), true);
    const double edw = worst_error(dw, product(dy, true, x_cols, false), false);  // by columns of dW
    if (recipe == Fp8Recipe::blockwise) {
      EXPECT_LT(ey, 0.1) << "forward: every row its own 1 x 128 tile";
      EXPECT_LT(edx, 0.1) << "input gradient: every row of dy its own 1 x 128 tile";
      EXPECT_LT(edw, 0.1) << "weight gradient: every column of x its own 128 x 1 tiles";
    } else {  // one scale: the tiny rows / columns fall to zero
      EXPECT_GT(ey, 0.5);
      EXPECT_GT(edx, 0.5);
      EXPECT_GT(edw, 0.5);
    }
  }
}

// Off (any precision but fp8): the backend's own GEMMs, bit for bit.
TEST(Fp8Linear, OffIsTheBackendsGemm) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const Tensor x = matrix(*be, 20, kIn, 9, kOne, kOne), w = matrix(*be, kOut, kIn, 10, kOne, kOne);
  Tensor a(*be, {20, kOut}), b(*be, {20, kOut});
  Fp8Linear().linear(*be, x, w, Tensor(), a);
  be->matmul(x, false, w, true, b, 1.f, 0.f);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << i;
}

// With operands that FP8 holds exactly (multiples of 1/8 up to 1.75: tensorwise scale 448 / 1.75 = 256, a power of
// two) the FP8 linear is the bf16 backend's linear bit for bit, bias and GELU included: the only arithmetic FP8 adds
// is the quantisation. (The bias is added to the GEMM's fp32 sums and rounded once, as Backend::linear's epilogue
// does; rounding the GEMM's output to bf16 before adding the bias differed in 93 of these 640 outputs, 64 after the
// GELU.) The products are multiples of 1/64 below 2^8: exact in fp32 in any order of summation.
TEST(Fp8Linear, ExactOperandsGiveTheBf16Linear) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const auto eighths = [&](int64_t rows, int64_t cols, uint64_t seed) {  // (rows, cols) bf16, k / 8 for |k| <= 14
    std::vector<float> v(size_t(rows * cols));
    Rng rng(seed, 0);
    for (float& e : v) e = float(int(rng.uniform() * 29.0) - 14) / 8.f;
    v[0] = 1.75f;  // the amax
    Tensor t(*be, {rows, cols}, DType::bf16);
    be->upload_f32(t, v.data());
    return t;
  };
  const Tensor x = eighths(20, kIn, 14), w = eighths(kOut, kIn, 15);  // (20, in), (out, in)
  Tensor bias(*be, {kOut}, DType::bf16);                                // (out): not multiples of 1/64
  const Tensor b32 = matrix(*be, 1, kOut, 16, kOne, kOne);
  be->convert(b32, bias);
  const Fp8Linear fp8(Fp8Recipe::tensorwise);
  for (LinearAct act : {LinearAct::none, LinearAct::gelu_tanh}) {
    Tensor y(*be, {20, kOut}, DType::bf16), y_fp8(*be, {20, kOut}, DType::bf16);  // (20, out)
    Tensor pre(*be, {20, kOut}, DType::bf16), pre_fp8(*be, {20, kOut}, DType::bf16);
    be->linear(x, w, bias, y, act, &pre);
    fp8.linear(*be, x, w, bias, y_fp8, act, &pre_fp8);
    int64_t differ = 0;
    for (int64_t i = 0; i < y.numel(); ++i) differ += y.b16()[i].bits != y_fp8.b16()[i].bits;
    EXPECT_EQ(differ, 0) << "of " << y.numel() << " outputs, act " << int(act);
  }
}

// A weight handed over as e4m3 codes with its tensorwise scale (parallel.fp8_param_gather's gathered weight) gives the
// forward and the input gradient of the weight it was quantised from, bit for bit: Fp8Linear multiplies the codes as
// they are instead of quantising the weight.
TEST(Fp8Linear, GatheredCodesAreTheWeightsOwn) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const Tensor x = matrix(*be, 20, kIn, 11, kOne, kOne), w = matrix(*be, kOut, kIn, 12, kOne, kOne);
  const Tensor dy = matrix(*be, 20, kOut, 13, kOne, kOne);
  Tensor codes(*be, {kOut, kIn}, DType::fp8_e4m3), scale(*be, {1, 1});  // (out, in), (1, 1)
  be->fp8_quantize(w, Fp8Tiling::tensor, codes, scale);
  const Fp8Linear fp8(Fp8Recipe::tensorwise);
  Fp8Weight gathered(codes);
  gathered.scale = &scale;
  Tensor y(*be, {20, kOut}), y_codes(*be, {20, kOut}), dx(*be, {20, kIn}), dx_codes(*be, {20, kIn});
  fp8.matmul(*be, x, w, true, y);
  fp8.matmul(*be, x, gathered, true, y_codes);
  fp8.matmul(*be, dy, w, false, dx);
  fp8.matmul(*be, dy, gathered, false, dx_codes);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.f32()[i], y_codes.f32()[i]) << "forward " << i;
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(dx.f32()[i], dx_codes.f32()[i]) << "input gradient " << i;
}

// An MLA layer's widths (DeepSeek-V3's linears) must be multiples of 16 too, each named by its key.
TEST(Fp8Linear, MlaWidthsAreChecked) {
  const std::string ds = "[model]\ntype = \"deepseek_v3\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 2\n"
                         "n_embd = 32\nffn_hidden = 32\nkv_lora_rank = 16\nqk_nope_head_dim = 8\nv_head_dim = 8\n"
                         "[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 2\nprecision = \"fp8\"\n";
  EXPECT_NO_THROW(check_fp8_widths(make_model_spec(parse_config_text(ds, "ds.toml", {"model.qk_rope_head_dim=16"}), 1).blocks));
  try {
    check_fp8_widths(make_model_spec(parse_config_text(ds, "ds.toml", {"model.qk_rope_head_dim=8"}), 1).blocks);
    ADD_FAILURE() << "qk_rope_head_dim 8 passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the rotary key width (model.qk_rope_head_dim) of block 1 (mla_layer) is 8, "
                                         "not a multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace relay
