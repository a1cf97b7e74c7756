// Every CPU kernel against a naive double-precision reference (tests/test_layers.cpp checks the
// layers' backward passes with finite differences).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

using namespace relay;

namespace {
std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.f) {
  Rng r(42, stream);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal()) * scale;
  return v;
}
void expect_close(const std::vector<float>& a, const std::vector<double>& b, double rtol, double atol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], atol + rtol * std::abs(b[i])) << what << " at " << i;
}
}  // namespace

struct GemmCase { bool ta, tb; int64_t m, n, k; };
class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesNaive) {
  auto c = GetParam();
  cpu::set_threads(2);
  auto a = randn(size_t(c.m * c.k), 1), b = randn(size_t(c.k * c.n), 2), y = randn(size_t(c.m * c.n), 3);
  std::vector<double> ref(y.size());
  const float alpha = 0.75f, beta = 0.5f;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        double av = c.ta ? a[size_t(p * c.m + i)] : a[size_t(i * c.k + p)];
        double bv = c.tb ? b[size_t(j * c.k + p)] : b[size_t(p * c.n + j)];
        s += av * bv;
      }
      ref[size_t(i * c.n + j)] = alpha * s + beta * y[size_t(i * c.n + j)];
    }
  cpu::gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), c.ta ? c.m : c.k, b.data(), c.tb ? c.k : c.n, beta, y.data(), c.n);
  expect_close(y, ref, 1e-5, 1e-5 * std::sqrt(double(c.k)), "gemm");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Values(GemmCase{false, false, 1, 1, 1}, GemmCase{false, true, 3, 7, 5},
                                           GemmCase{true, false, 17, 9, 33}, GemmCase{true, true, 8, 16, 4},
                                           GemmCase{false, true, 127, 65, 255}, GemmCase{true, false, 64, 128, 300}));

TEST(CpuKernels, BiasAndBiasGrad) {
  const int64_t r = 37, c = 129;
  auto y = randn(size_t(r * c), 4), b = randn(size_t(c), 5);
  std::vector<double> ref(y.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) ref[size_t(i * c + j)] = double(y[size_t(i * c + j)]) + b[size_t(j)];
  auto yy = y;
  cpu::add_bias(yy.data(), b.data(), r, c);
  expect_close(yy, ref, 1e-6, 1e-6, "add_bias");
  std::vector<float> db(size_t(c), 1.f);
  std::vector<double> dref(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    double s = 0;
    for (int64_t i = 0; i < r; ++i) s += y[size_t(i * c + j)];
    dref[size_t(j)] = 1.0 + s;  // beta = 1 accumulates
  }
  cpu::bias_grad(y.data(), db.data(), r, c, 1.f);
  expect_close(db, dref, 1e-5, 1e-5, "bias_grad");
}

TEST(CpuKernels, Activations) {
  auto x = randn(1000, 6, 3.f), dy = randn(1000, 7);
  std::vector<float> y(x.size()), dx(x.size());
  std::vector<double> ry(x.size()), rdx(x.size());
  auto check = [&](auto fwd, auto bwd, auto f, auto df, const char* name) {
    fwd(x.data(), y.data(), int64_t(x.size()));
    bwd(x.data(), dy.data(), dx.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ry[i] = f(double(x[i]));
      rdx[i] = dy[i] * df(double(x[i]));
    }
    expect_close(y, ry, 1e-6, 1e-6, name);
    expect_close(dx, rdx, 1e-5, 1e-6, name);
  };
  check(cpu::relu_forward<float>, cpu::relu_backward<float>, [](double v) { return v > 0 ? v : 0.0; },
        [](double v) { return v > 0 ? 1.0 : 0.0; }, "relu");
  check(cpu::tanh_forward<float>, cpu::tanh_backward<float>, [](double v) { return std::tanh(v); },
        [](double v) { return 1 - std::tanh(v) * std::tanh(v); }, "tanh");
  check(cpu::gelu_forward<float>, cpu::gelu_backward<float>, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); },
        [](double v) { return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI); },
        "gelu");
}

TEST(CpuKernels, SumSquaresAndScaleAreThreadCountIndependent) {
  auto x = randn(300001, 8);
  double ref = 0;
  for (float v : x) ref += double(v) * v;
  cpu::set_threads(1);
  double one = cpu::sum_squares(x.data(), int64_t(x.size()));
  cpu::set_threads(2);
  double two = cpu::sum_squares(x.data(), int64_t(x.size()));
  EXPECT_EQ(one, two);  // bitwise: fixed blocks summed in order
  EXPECT_NEAR(one, ref, 1e-9 * ref);
  cpu::scale(x.data(), 0.5f, int64_t(x.size()));
  EXPECT_NEAR(cpu::sum_squares(x.data(), int64_t(x.size())), ref / 4, 1e-9 * ref);
}

TEST(CpuKernels, LayerNormForwardMatchesTorchFormula) {
  const int64_t r = 5, d = 33;
  auto x = randn(size_t(r * d), 9, 2.f), g = randn(size_t(d), 10), b = randn(size_t(d), 11);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(r)), rstd(static_cast<size_t>(r));
  cpu::layernorm_forward(x.data(), g.data(), b.data(), 1e-5f, y.data(), mean.data(), rstd.data(), r, d);
  std::vector<double> ref(x.size());
  for (int64_t i = 0; i < r; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mu += x[size_t(i * d + j)];
    mu /= d;
    for (int64_t j = 0; j < d; ++j) var += std::pow(x[size_t(i * d + j)] - mu, 2);
    var /= d;  // biased, as torch
    for (int64_t j = 0; j < d; ++j)
      ref[size_t(i * d + j)] = (x[size_t(i * d + j)] - mu) / std::sqrt(var + 1e-5) * g[size_t(j)] + b[size_t(j)];
  }
  expect_close(y, ref, 1e-5, 1e-5, "layernorm");
}

TEST(CpuKernels, CrossEntropyAndArgmax) {
  const int64_t r = 6, c = 11;
  auto z = randn(size_t(r * c), 12, 5.f);
  std::vector<int32_t> t = {0, 10, 3, 3, 7, 1};
  std::vector<float> loss(static_cast<size_t>(r)), dz(z.size());
  const float scale = 0.25f;
  cpu::cross_entropy(z.data(), t.data(), scale, loss.data(), dz.data(), r, c);
  std::vector<double> rl(static_cast<size_t>(r)), rdz(z.size());
  for (int64_t i = 0; i < r; ++i) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(double(z[size_t(i * c + j)]));
    rl[size_t(i)] = std::log(s) - z[size_t(i * c + t[size_t(i)])];
    for (int64_t j = 0; j < c; ++j)
      rdz[size_t(i * c + j)] = (std::exp(double(z[size_t(i * c + j)])) / s - (j == t[size_t(i)])) * scale;
  }
  expect_close(loss, rl, 1e-5, 1e-5, "ce loss");
  expect_close(dz, rdz, 1e-5, 1e-7, "ce grad");
  std::vector<int32_t> am(static_cast<size_t>(r));
  cpu::argmax(z.data(), am.data(), r, c);
  for (int64_t i = 0; i < r; ++i) {
    int32_t best = 0;
    for (int32_t j = 1; j < c; ++j)
      if (z[size_t(i * c + j)] > z[size_t(i * c + best)]) best = j;
    EXPECT_EQ(am[size_t(i)], best);
  }
}

// A GPT-2 vocabulary (50257: 3141 whole 16-lane blocks and a tail of 1) in f32 and bf16 logits, each against the double
// reference of the values it was given: the loss within 1e-5, each gradient element within its dtype's rounding.
TEST(CpuKernels, CrossEntropyGpt2Vocabulary) {
  const int64_t r = 3, c = 50257;
  auto z = randn(size_t(r * c), 16, 4.f);
  const std::vector<int32_t> t = {0, 50256, 31337};
  const float scale = 1.f / 3;
  std::vector<bf16> zb(z.size());
  for (size_t i = 0; i < z.size(); ++i) zb[i] = f32_to_bf16(z[i]);
  std::vector<float> zr(z.size());  // the bf16 logits' values
  for (size_t i = 0; i < z.size(); ++i) zr[i] = bf16_to_f32(zb[i]);
  for (const bool half : {false, true}) {
    const std::vector<float>& in = half ? zr : z;
    std::vector<float> loss(static_cast<size_t>(r), 0.f), dz(z.size());
    if (half) {
      std::vector<bf16> db(z.size());
      cpu::cross_entropy(zb.data(), t.data(), scale, loss.data(), db.data(), r, c);
      for (size_t i = 0; i < z.size(); ++i) dz[i] = bf16_to_f32(db[i]);
    } else {
      cpu::cross_entropy(z.data(), t.data(), scale, loss.data(), dz.data(), r, c);
    }
    std::vector<double> rl(static_cast<size_t>(r)), rdz(z.size());
    for (int64_t i = 0; i < r; ++i) {
      double mx = in[size_t(i * c)], s = 0;
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, double(in[size_t(i * c + j)]));
      for (int64_t j = 0; j < c; ++j) s += std::exp(double(in[size_t(i * c + j)]) - mx);
      const double lse = std::log(s) + mx;
      rl[size_t(i)] = lse - in[size_t(i * c + t[size_t(i)])];
      for (int64_t j = 0; j < c; ++j)
        rdz[size_t(i * c + j)] = (std::exp(double(in[size_t(i * c + j)]) - lse) - (j == t[size_t(i)])) * scale;
    }
    expect_close(loss, rl, 1e-6, 1e-5, half ? "bf16 ce loss" : "ce loss");
    expect_close(dz, rdz, half ? 1.0 / 128 : 1e-5, 1e-9, half ? "bf16 ce grad" : "ce grad");
  }
}

// A negative target is ignored (torch's ignore_index): loss 0 and a zero gradient row, the other rows unchanged;
// also through the vocabulary-parallel finish.
TEST(CpuKernels, CrossEntropyIgnoresNegativeTargets) {
  const int64_t r = 4, c = 9;
  auto z = randn(size_t(r * c), 15, 3.f);
  const std::vector<int32_t> all = {2, 5, 0, 8}, some = {2, -1, 0, -1};
  std::vector<float> la(static_cast<size_t>(r)), ls(la.size()), da(z.size()), dsome(z.size(), 7.f);
  cpu::cross_entropy(z.data(), all.data(), 0.5f, la.data(), da.data(), r, c);
  cpu::cross_entropy(z.data(), some.data(), 0.5f, ls.data(), dsome.data(), r, c);
  std::vector<float> mx(static_cast<size_t>(r)), part(size_t(2 * r)), lf(la.size()), df(z.size(), 7.f);
  cpu::row_max(z.data(), mx.data(), r, c);
  cpu::cross_entropy_partial(z.data(), some.data(), 0, mx.data(), part.data(), r, c);
  cpu::cross_entropy_finish(z.data(), some.data(), 0, mx.data(), part.data(), 0.5f, lf.data(), df.data(), r, c);
  for (int64_t i = 0; i < r; ++i) {
    const bool ignored = some[size_t(i)] < 0;
    EXPECT_EQ(ls[size_t(i)], ignored ? 0.f : la[size_t(i)]) << "row " << i;
    EXPECT_NEAR(lf[size_t(i)], ignored ? 0.f : la[size_t(i)], 1e-5) << "row " << i << " (vocabulary-parallel)";
    for (int64_t j = 0; j < c; ++j) {
      EXPECT_EQ(dsome[size_t(i * c + j)], ignored ? 0.f : da[size_t(i * c + j)]) << "row " << i << " col " << j;
      EXPECT_NEAR(df[size_t(i * c + j)], ignored ? 0.f : da[size_t(i * c + j)], 1e-6) << "row " << i << " col " << j;
    }
  }
}

TEST(CpuKernels, Mse) {
  const int64_t r = 4, k = 3;
  auto p = randn(size_t(r * k), 13), t = randn(size_t(r * k), 14);
  std::vector<float> loss(static_cast<size_t>(r)), dp(p.size());
  cpu::mse(p.data(), t.data(), 0.5f, loss.data(), dp.data(), r, k);
  for (int64_t i = 0; i < r; ++i) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) {
      double e = double(p[size_t(i * k + j)]) - t[size_t(i * k + j)];
      s += e * e;
      EXPECT_NEAR(dp[size_t(i * k + j)], 2 * e / k * 0.5, 1e-6);
    }
    EXPECT_NEAR(loss[size_t(i)], s / k, 1e-6);
  }
}

// MLA's rotary regrouping (transformers' apply_rotary_pos_emb_interleave: view (d/2, 2), transpose, so evens then
// odds): two heads of 6 columns whose rotary part is columns [2, 6); then a round trip through the parallel loop.
TEST(CpuKernels, RotaryColumnsRegroupAsTransformersInterleave) {
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // (1, 2 heads * 6)
  std::vector<float> pe(8);
  cpu::rotary_columns(x.data(), pe.data(), 1, 2, 6, 2, 4, /*interleaved=*/true, /*gather=*/true);
  EXPECT_EQ(pe, (std::vector<float>{2, 4, 3, 5, 8, 10, 9, 11}));
  cpu::rotary_columns(x.data(), pe.data(), 1, 2, 6, 2, 4, /*interleaved=*/false, /*gather=*/true);
  EXPECT_EQ(pe, (std::vector<float>{2, 3, 4, 5, 8, 9, 10, 11}));
  std::vector<float> back(12, -1.f);  // scatter writes the rotary columns only
  cpu::rotary_columns(pe.data(), back.data(), 1, 2, 6, 2, 4, /*interleaved=*/false, /*gather=*/false);
  EXPECT_EQ(back, (std::vector<float>{-1, -1, 2, 3, 4, 5, -1, -1, 8, 9, 10, 11}));
  // (1024, 4 heads * 32), rotary columns [24, 32): above kParallelElems, two threads; gather then scatter is x.
  cpu::set_threads(2);
  const int64_t rows = 1024, heads = 4, w = 32, dr = 8;
  const auto big = randn(size_t(rows * heads * w), 20);
  std::vector<float> big_pe(size_t(rows * heads * dr)), big_back = randn(big.size(), 21);
  cpu::rotary_columns(big.data(), big_pe.data(), rows, heads, w, 24, dr, true, true);
  cpu::rotary_columns(big_pe.data(), big_back.data(), rows, heads, w, 24, dr, true, false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < heads * w; ++c)
      if (c % w >= 24) ASSERT_EQ(big_back[size_t(r * heads * w + c)], big[size_t(r * heads * w + c)]) << r << ", " << c;
  EXPECT_EQ(big_pe[size_t(1000 * heads * dr + 3 * dr + 5)], big[size_t(1000 * heads * w + 3 * w + 24 + 3)]);
}

// Positions restarting with each document (data.document_mask): rows 0-2 one document, rows 3-4 the next. Rotary
// embeddings and the learned position table read row r at positions[r], so each document gets exactly what it
// gets run alone (rows [0, 3) with T 3, rows [3, 5) with T 2); the position table's gradient sums by position.
TEST(CpuKernels, PositionsRestartWithEachDocument) {
  const int64_t heads = 2, hd = 8, cols = heads * hd, T = 5;
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1};
  auto x = randn(size_t(T * cols), 16);
  std::vector<float> y(x.size()), y_alone(x.size());
  cpu::rope(x.data(), y.data(), T, T, heads, hd, 10000.0, 0, false, pos.data());
  cpu::rope(x.data(), y_alone.data(), 3, 3, heads, hd, 10000.0, 0, false);
  cpu::rope(x.data() + 3 * cols, y_alone.data() + 3 * cols, 2, 2, heads, hd, 10000.0, 0, false);
  EXPECT_EQ(y, y_alone);
  const int64_t C = 4, V = 6;
  const std::vector<int32_t> tokens = {1, 5, 0, 2, 1};
  auto wte = randn(size_t(V * C), 17), wpe = randn(size_t(T * C), 18), dout = randn(size_t(T * C), 19);
  std::vector<float> out(size_t(T * C)), dwte(wte.size(), 0.f), dwpe(wpe.size(), 0.f);
  cpu::embedding_forward(tokens.data(), wte.data(), wpe.data(), out.data(), T, C, T, 0, V, pos.data());
  cpu::embedding_backward(tokens.data(), dout.data(), dwte.data(), dwpe.data(), T, C, T, 0, V, pos.data());
  for (int64_t r = 0; r < T; ++r)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(out[size_t(r * C + c)], wte[size_t(tokens[size_t(r)] * C + c)] + wpe[size_t(pos[size_t(r)] * C + c)]);
      const int64_t p = r;  // dwpe row p sums the rows at position p, in row order
      float want = 0.f;
      for (int64_t s = 0; s < T; ++s)
        if (pos[size_t(s)] == p) want += dout[size_t(s * C + c)];
      EXPECT_EQ(dwpe[size_t(p * C + c)], want) << "dwpe position " << p;
    }
}

// The weight gradient's column blocks narrow with the thread count (so that a 32- to 64-wide norm uses every thread);
// each column's sum runs over the rows in order whatever block holds it, so the bits must not depend on the threads.
TEST(CpuKernels, RmsNormWeightGradientIsThreadCountIndependent) {
  const int64_t rows = 1024;
  for (int64_t d : {32, 48, 64, 100, 200}) {
    auto dy = randn(size_t(rows * d), 12), x = randn(size_t(rows * d), 13), rstd = randn(size_t(rows), 14);
    std::vector<double> ref(static_cast<size_t>(d), 0.5);  // dgamma starts at 0.5: the kernel adds to it
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i)
        ref[size_t(i)] += double(dy[size_t(r * d + i)]) * x[size_t(r * d + i)] * rstd[size_t(r)];
    std::vector<float> one(static_cast<size_t>(d), 0.5f), two = one;
    cpu::set_threads(1);
    cpu::rmsnorm_backward_weight(dy.data(), x.data(), rstd.data(), one.data(), rows, d);
    cpu::set_threads(2);
    cpu::rmsnorm_backward_weight(dy.data(), x.data(), rstd.data(), two.data(), rows, d);
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(one[size_t(i)], two[size_t(i)]) << "d " << d << " column " << i;
    expect_close(two, ref, 1e-5, 1e-4, "rmsnorm dgamma");
  }
}
