// GPT-2's CPU reference kernels (kernels/cpu/transformer.cpp, GELU tanh and add in elementwise.cpp)
// against naive double-precision references, their backward passes against central differences of
// the double forward (as torch.autograd.gradcheck), one KV-cache decoding step against the full
// forward, and bitwise independence of the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

using namespace relay;

namespace {

std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.f) {
  Rng r(7, stream);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal()) * scale;
  return v;
}

// Double causal attention: qkv (B*T, 3C) -> out (B*T, C).
std::vector<double> attention_double(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H;
  std::vector<double> out(static_cast<size_t>(B * T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> a(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += qkv[static_cast<size_t>((b * T + t) * 3 * C + h * hd + i)] *
                 qkv[static_cast<size_t>((b * T + s) * 3 * C + C + h * hd + i)];
          a[static_cast<size_t>(s)] = d / std::sqrt(double(hd));
          mx = std::max(mx, a[static_cast<size_t>(s)]);
        }
        for (auto& x : a) sum += (x = std::exp(x - mx));
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < hd; ++i)
            out[static_cast<size_t>((b * T + t) * C + h * hd + i)] +=
                a[static_cast<size_t>(s)] / sum * qkv[static_cast<size_t>((b * T + s) * 3 * C + 2 * C + h * hd + i)];
      }
  return out;
}

// Central differences of loss(x) = sum(f(x) * R) in double, h = 1e-6.
std::vector<double> numeric_grad(const std::vector<double>& x, const std::vector<double>& R,
                                 const std::function<std::vector<double>(const std::vector<double>&)>& f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += 1e-6;
    xm[i] -= 1e-6;
    auto yp = f(xp), ym = f(xm);
    double lp = 0, lm = 0;
    for (size_t k = 0; k < R.size(); ++k) {
      lp += yp[k] * R[k];
      lm += ym[k] * R[k];
    }
    g[i] = (lp - lm) / 2e-6;
  }
  return g;
}

}  // namespace

TEST(TransformerKernels, AttentionForwardMatchesDoubleAndSavesCausalProbabilities) {
  cpu::set_threads(2);
  const int64_t B = 2, T = 5, H = 2, C = 6;
  auto qkv = randn(static_cast<size_t>(B * T * 3 * C), 1);
  std::vector<float> att(static_cast<size_t>(B * H * T * T)), out(static_cast<size_t>(B * T * C));
  cpu::attention_forward(qkv.data(), att.data(), out.data(), B, T, C, H);
  auto ref = attention_double(std::vector<double>(qkv.begin(), qkv.end()), B, T, C, H);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-6 + 1e-5 * std::abs(ref[i])) << i;
  for (int64_t r = 0; r < B * H * T; ++r) {
    const int64_t t = r % T;
    double sum = 0;
    for (int64_t s = 0; s < T; ++s) {
      const float p = att[static_cast<size_t>(r * T + s)];
      if (s > t) EXPECT_EQ(p, 0.f) << "above the diagonal";
      sum += p;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST(TransformerKernels, AttentionBackwardMatchesCentralDifferences) {
  cpu::set_threads(2);
  const int64_t B = 2, T = 5, H = 2, C = 6;
  auto qkv = randn(static_cast<size_t>(B * T * 3 * C), 2);
  auto R = randn(static_cast<size_t>(B * T * C), 3);
  std::vector<float> att(static_cast<size_t>(B * H * T * T)), out(static_cast<size_t>(B * T * C)), dqkv(qkv.size(), 7.f);
  cpu::attention_forward(qkv.data(), att.data(), out.data(), B, T, C, H);
  cpu::attention_backward(R.data(), qkv.data(), att.data(), dqkv.data(), B, T, C, H);  // overwrites dqkv
  auto num = numeric_grad(std::vector<double>(qkv.begin(), qkv.end()), std::vector<double>(R.begin(), R.end()),
                          [&](const std::vector<double>& x) { return attention_double(x, B, T, C, H); });
  for (size_t i = 0; i < dqkv.size(); ++i) EXPECT_NEAR(dqkv[i], num[i], 2e-5 + 1e-4 * std::abs(num[i])) << "dqkv " << i;
}

TEST(TransformerKernels, DecodeStepsEqualTheFullForward) {
  cpu::set_threads(1);
  const int64_t T = 7, H = 3, C = 12;
  auto qkv = randn(static_cast<size_t>(T * 3 * C), 4);
  std::vector<float> att(static_cast<size_t>(H * T * T)), out(static_cast<size_t>(T * C));
  cpu::attention_forward(qkv.data(), att.data(), out.data(), 1, T, C, H);
  std::vector<float> kc(static_cast<size_t>(T * C), NAN), vc(kc.size(), NAN), o(static_cast<size_t>(C));
  for (int64_t t = 0; t < T; ++t) {
    cpu::attention_decode(qkv.data() + t * 3 * C, kc.data(), vc.data(), o.data(), 1, t, T, C, H);
    for (int64_t i = 0; i < C; ++i)
      EXPECT_NEAR(o[static_cast<size_t>(i)], out[static_cast<size_t>(t * C + i)], 1e-6) << "t " << t << " i " << i;
  }
}

TEST(TransformerKernels, EmbeddingForwardBackwardWithRepeatedTokens) {
  const int64_t V = 11, T = 4, C = 5, rows = 12;  // 3 sequences of 4
  std::vector<int32_t> tok = {3, 3, 7, 0, 3, 10, 10, 3, 0, 0, 0, 5};
  auto wte = randn(static_cast<size_t>(V * C), 5), wpe = randn(static_cast<size_t>(T * C), 6);
  auto dout = randn(static_cast<size_t>(rows * C), 7);
  std::vector<float> out(static_cast<size_t>(rows * C));
  cpu::set_threads(2);
  cpu::embedding_forward(tok.data(), wte.data(), wpe.data(), out.data(), rows, C, T, 0, V);
  std::vector<double> dwte_ref(wte.size(), 0.5), dwpe_ref(wpe.size(), -0.25);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const size_t o = static_cast<size_t>(r * C + c), e = static_cast<size_t>(tok[static_cast<size_t>(r)] * C + c),
                   p = static_cast<size_t>((r % T) * C + c);
      EXPECT_EQ(out[o], wte[e] + wpe[p]);
      dwte_ref[e] += dout[o];
      dwpe_ref[p] += dout[o];
    }
  std::vector<float> dwte(wte.size(), 0.5f), dwpe(wpe.size(), -0.25f);  // accumulated into
  cpu::embedding_backward(tok.data(), dout.data(), dwte.data(), dwpe.data(), rows, C, T, 0, V);
  for (size_t i = 0; i < dwte.size(); ++i) EXPECT_NEAR(dwte[i], dwte_ref[i], 1e-5) << "dwte " << i;
  for (size_t i = 0; i < dwpe.size(); ++i) EXPECT_NEAR(dwpe[i], dwpe_ref[i], 1e-5) << "dwpe " << i;
}

// Tensor parallelism's kernels against the whole-vocabulary ones: the shards' embeddings add up to the
// whole lookup (bitwise: the other shards contribute zeros), and the vocabulary-parallel cross-entropy
// over two shards (uneven: 7 and 8 of 15 columns) gives the fused loss and each shard's columns of its
// gradient.
TEST(TransformerKernels, VocabularyShardsAddUpToTheWholeVocabulary) {
  const int64_t V = 15, T = 3, C = 4, rows = 6, split = 7;
  std::vector<int32_t> tok = {0, 14, 7, 6, 3, 7};
  auto wte = randn(static_cast<size_t>(V * C), 11), wpe = randn(static_cast<size_t>(T * C), 12);
  std::vector<float> whole(static_cast<size_t>(rows * C)), a(whole.size()), b(whole.size());
  cpu::embedding_forward(tok.data(), wte.data(), wpe.data(), whole.data(), rows, C, T, 0, V);
  cpu::embedding_forward(tok.data(), wte.data(), wpe.data(), a.data(), rows, C, T, 0, split);
  cpu::embedding_forward(tok.data(), wte.data() + split * C, static_cast<const float*>(nullptr), b.data(), rows, C, T, split, V - split);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(a[i] + b[i], whole[i]) << i;

  auto logits = randn(static_cast<size_t>(rows * V), 13);
  std::vector<float> losses(static_cast<size_t>(rows)), dl(logits.size());
  cpu::cross_entropy(logits.data(), tok.data(), 0.5f, losses.data(), dl.data(), rows, V);
  // The two shards as (rows, cols) matrices, the group's reductions done here.
  std::vector<float> l0, l1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < V; ++c) (c < split ? l0 : l1).push_back(logits[static_cast<size_t>(r * V + c)]);
  std::vector<float> m0(rows), m1(rows), p0(2 * rows), p1(2 * rows), total(2 * rows), mx(rows);
  cpu::row_max(l0.data(), m0.data(), rows, split);
  cpu::row_max(l1.data(), m1.data(), rows, V - split);
  for (int64_t r = 0; r < rows; ++r) mx[r] = std::max(m0[r], m1[r]);
  cpu::cross_entropy_partial(l0.data(), tok.data(), 0, mx.data(), p0.data(), rows, split);
  cpu::cross_entropy_partial(l1.data(), tok.data(), split, mx.data(), p1.data(), rows, V - split);
  for (size_t i = 0; i < total.size(); ++i) total[i] = p0[i] + p1[i];
  std::vector<float> loss0(rows), loss1(rows), d0(l0.size()), d1(l1.size());
  cpu::cross_entropy_finish(l0.data(), tok.data(), 0, mx.data(), total.data(), 0.5f, loss0.data(), d0.data(), rows, split);
  cpu::cross_entropy_finish(l1.data(), tok.data(), split, mx.data(), total.data(), 0.5f, loss1.data(), d1.data(), rows,
                            V - split);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(loss0[r], losses[r], 1e-6) << "row " << r;
    EXPECT_EQ(loss0[r], loss1[r]) << "row " << r;
    for (int64_t c = 0; c < V; ++c) {
      const float got = c < split ? d0[static_cast<size_t>(r * split + c)] : d1[static_cast<size_t>(r * (V - split) + c - split)];
      EXPECT_NEAR(got, dl[static_cast<size_t>(r * V + c)], 1e-7) << "row " << r << " col " << c;
    }
  }
}

TEST(TransformerKernels, BitwiseIndependentOfThreadCount) {
  const int64_t V = 50, T = 16, C = 32, H = 4, B = 3, rows = B * T;
  std::vector<int32_t> tok(static_cast<size_t>(rows));
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(i * 13 % 7);  // many repeats
  auto dout = randn(static_cast<size_t>(rows * C), 8), qkv = randn(static_cast<size_t>(rows * 3 * C), 9);
  auto dy = randn(static_cast<size_t>(rows * C), 10);
  auto run = [&](int threads) {
    cpu::set_threads(threads);
    std::vector<float> dwte(static_cast<size_t>(V * C), 0.f), dwpe(static_cast<size_t>(T * C), 0.f);
    cpu::embedding_backward(tok.data(), dout.data(), dwte.data(), dwpe.data(), rows, C, T, 0, V);
    std::vector<float> att(static_cast<size_t>(B * H * T * T)), out(static_cast<size_t>(rows * C)), dq(qkv.size());
    cpu::attention_forward(qkv.data(), att.data(), out.data(), B, T, C, H);
    cpu::attention_backward(dy.data(), qkv.data(), att.data(), dq.data(), B, T, C, H);
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    dwte.insert(dwte.end(), out.begin(), out.end());
    dwte.insert(dwte.end(), dq.begin(), dq.end());
    return dwte;
  };
  EXPECT_EQ(run(1), run(2));
  cpu::set_threads(2);
}

TEST(TransformerKernels, GeluTanhAndItsDerivative) {
  std::vector<float> x;
  for (int i = -800; i <= 800; ++i) x.push_back(float(i) / 100.f);
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.f);
  cpu::gelu_tanh_forward(x.data(), y.data(), static_cast<int64_t>(x.size()));
  cpu::gelu_tanh_backward(x.data(), ones.data(), dx.data(), static_cast<int64_t>(x.size()));
  auto f = [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); };
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(y[i], f(v), 1e-6 + 1e-6 * std::abs(f(v))) << "gelu_tanh(" << v << ")";
    const double d = (f(v + 1e-6) - f(v - 1e-6)) / 2e-6;
    EXPECT_NEAR(dx[i], d, 2e-6 + 1e-5 * std::abs(d)) << "gelu_tanh'(" << v << ")";
  }
}

TEST(TransformerKernels, AddMayAliasItsInputs) {
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  cpu::add(a.data(), b.data(), a.data(), 3);
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
}

// A language model's loss writes its gradient over the logits (one vocabulary-sized buffer).
TEST(TransformerKernels, CrossEntropyGradientInPlaceEqualsSeparate) {
  const int64_t rows = 6, V = 300;
  auto logits = randn(static_cast<size_t>(rows * V), 11, 3.f);
  std::vector<int32_t> tg = {0, 299, 5, 5, 150, 1};
  std::vector<float> loss1(rows), loss2(rows), d(logits.size()), inplace = logits;
  cpu::cross_entropy(logits.data(), tg.data(), 0.25f, loss1.data(), d.data(), rows, V);
  cpu::cross_entropy(inplace.data(), tg.data(), 0.25f, loss2.data(), inplace.data(), rows, V);
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(d, inplace);
}
