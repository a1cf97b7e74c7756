// Mixture-of-experts routing (Backend::moe_router_forward / backward, DeepSeek-V3's moe_group_router_forward /
// backward, moe_combine / backward) against naive double-precision references and finite differences, and the sparse
// MLP (model/moe.hpp) on routings the issue names: experts that receive no token, and a layer where every token picks
// one expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/backend.hpp"
#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "model/moe.hpp"

using namespace relay;

namespace {

std::unique_ptr<Backend> cpu() { return make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32}); }

std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.f) {
  Rng r(7, stream);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal()) * scale;
  return v;
}
Tensor make(Backend& be, Shape s, const std::vector<float>& v) {
  Tensor t(be, std::move(s));
  be.upload_f32(t, v.data());
  return t;
}
template <typename X>
std::vector<X> get(Backend& be, const Tensor& t) {
  std::vector<X> v(size_t(t.numel()));
  be.download(v.data(), t);
  return v;
}

// The router's math in double for one token's logits z (E): softmax p, lse, top-k experts (given) and their weights.
struct RouterRef {
  std::vector<double> p, w;
  double lse = 0;
};
RouterRef router_ref(const std::vector<double>& z, const std::vector<int32_t>& experts, bool renorm) {
  RouterRef r;
  const double mx = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (double v : z) s += std::exp(v - mx);
  r.lse = mx + std::log(s);
  for (double v : z) r.p.push_back(std::exp(v - r.lse));
  double top = 0;
  for (int32_t e : experts) top += r.p[size_t(e)];
  for (int32_t e : experts) r.w.push_back(renorm ? r.p[size_t(e)] / top : r.p[size_t(e)]);
  return r;
}

}  // namespace

TEST(MoeRouter, ForwardMatchesNaive) {
  auto be = cpu();
  const int64_t n = 6, E = 5, k = 2;
  const auto z = randn(size_t(n * E), 1, 2.f);
  for (bool renorm : {true, false}) {
    Tensor logits = make(*be, {n, E}, z), probs(*be, {n, E}), lse(*be, {n}), experts(*be, {n, k}, DType::i32),
           weights(*be, {n, k});
    be->moe_router_forward(logits, k, renorm, probs, lse, experts, weights);
    const auto p = get<float>(*be, probs), l = get<float>(*be, lse), w = get<float>(*be, weights);
    const auto ex = get<int32_t>(*be, experts);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> zt(z.begin() + t * E, z.begin() + (t + 1) * E);
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return zt[size_t(a)] > zt[size_t(b)]; });
      order.resize(size_t(k));
      const RouterRef r = router_ref(zt, order, renorm);
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(ex[size_t(t * k + j)], order[size_t(j)]) << "token " << t << " choice " << j;
        EXPECT_NEAR(w[size_t(t * k + j)], r.w[size_t(j)], 1e-6) << "token " << t << " weight " << j;
      }
      for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(p[size_t(t * E + e)], r.p[size_t(e)], 1e-6);
      EXPECT_NEAR(l[size_t(t)], r.lse, 1e-5);
    }
  }
}

// moe.expert_bias: the experts are the top k of p + bias, the weights stay p's (renormalised).
TEST(MoeRouter, BiasChoosesButDoesNotWeigh) {
  auto be = cpu();
  const int64_t n = 1, E = 4, k = 2;
  const std::vector<float> z = {2.f, 1.f, 0.f, -1.f}, b = {0.f, 0.f, 0.f, 1.f};  // expert 3 lifted above 1 and 2
  Tensor logits = make(*be, {n, E}, z), probs(*be, {n, E}), lse(*be, {n}), experts(*be, {n, k}, DType::i32),
         weights(*be, {n, k}), bias = make(*be, {E}, b);
  be->moe_router_forward(logits, k, true, probs, lse, experts, weights, bias);
  const auto ex = get<int32_t>(*be, experts);
  const auto w = get<float>(*be, weights);
  EXPECT_EQ(ex, (std::vector<int32_t>{3, 0}));  // scores p + b: 0.644, 0.237, 0.087, 1.032
  const RouterRef r = router_ref({2, 1, 0, -1}, {3, 0}, true);
  EXPECT_NEAR(w[0], r.w[0], 1e-6);
  EXPECT_NEAR(w[1], r.w[1], 1e-6);
}

// Token t's logits' gradient got[t E, (t + 1) E) against central differences (step 1e-5) of loss(token t's logits).
template <class Loss>
void expect_central_differences(const std::vector<float>& got, const std::vector<float>& z, int64_t t, int64_t E,
                                Loss&& loss, const char* what) {
  for (int64_t e = 0; e < E; ++e) {
    std::vector<double> hi(z.begin() + t * E, z.begin() + (t + 1) * E), lo = hi;
    hi[size_t(e)] += 1e-5;
    lo[size_t(e)] -= 1e-5;
    const double want = (loss(hi) - loss(lo)) / 2e-5;
    EXPECT_NEAR(got[size_t(t * E + e)], want, 1e-5 + 1e-4 * std::abs(want)) << "token " << t << " expert " << e << what;
  }
}

// d/dz of L = sum a[t,j] w[t,j] + sum g[s,e] p[t,e] + zs sum lse[t]^2 (the routing held fixed) by central
// differences in double, against moe_router_backward with dweights = a, seq_grad = g, z_scale = zs.
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  auto be = cpu();
  const int64_t n = 6, E = 4, k = 2, T = 3;
  const float zs = 0.3f;
  const auto z = randn(size_t(n * E), 2, 1.5f), a = randn(size_t(n * k), 3), g = randn(size_t(n / T * E), 4);
  for (bool renorm : {true, false}) {
    Tensor logits = make(*be, {n, E}, z), probs(*be, {n, E}), lse(*be, {n}), experts(*be, {n, k}, DType::i32),
           weights(*be, {n, k});
    be->moe_router_forward(logits, k, renorm, probs, lse, experts, weights);
    Tensor dw = make(*be, {n, k}, a), sg = make(*be, {n / T, E}, g), dz(*be, {n, E});
    be->moe_router_backward(probs, lse, experts, dw, renorm, sg, T, zs, dz);
    const auto got = get<float>(*be, dz);
    const auto ex = get<int32_t>(*be, experts);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int32_t> chosen(ex.begin() + t * k, ex.begin() + (t + 1) * k);
      auto loss = [&](const std::vector<double>& zt) {
        const RouterRef r = router_ref(zt, chosen, renorm);
        double L = zs * r.lse * r.lse;
        for (int64_t j = 0; j < k; ++j) L += a[size_t(t * k + j)] * r.w[size_t(j)];
        for (int64_t e = 0; e < E; ++e) L += g[size_t(t / T * E + e)] * r.p[size_t(e)];
        return L;
      };
      expect_central_differences(got, z, t, E, loss, renorm ? " (renormalised)" : "");
    }
  }
}

// DeepSeek-V3's router (moe_group_router_forward): 8 experts in 4 groups of 2, the best 2 groups kept by the sum of
// their two best scores. Expert 0 has the best score of all but its group (0.953 + 0.047) loses to groups 1 and 2;
// then a bias on expert 4 moves it to the front of the choice while the weights stay the unbiased scores.
TEST(MoeGroupRouter, GroupsLimitTheChoiceAndTheBiasChoosesOnly) {
  auto be = cpu();
  const int64_t E = 8, k = 2;
  const std::vector<float> z = {3.f, -3.f, 0.9f, 0.8f, 0.5f, 0.4f, -2.f, -2.5f};
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (bool biased : {false, true}) {
    std::vector<float> b(size_t(E), 0.f);
    if (biased) b[4] = 0.2f;
    Tensor logits = make(*be, {1, E}, z), probs(*be, {1, E}), experts(*be, {1, k}, DType::i32), weights(*be, {1, k});
    Tensor bias = make(*be, {E}, b);
    be->moe_group_router_forward(logits, {k, 4, 2, true, 2.5f}, probs, experts, weights, bias);
    const auto ex = get<int32_t>(*be, experts);
    const auto w = get<float>(*be, weights), p = get<float>(*be, probs);
    const std::vector<int32_t> want = biased ? std::vector<int32_t>{4, 2} : std::vector<int32_t>{2, 3};
    EXPECT_EQ(ex, want);
    const double s = sig(z[size_t(want[0])]) + sig(z[size_t(want[1])]);
    for (int64_t j = 0; j < k; ++j) EXPECT_NEAR(w[size_t(j)], 2.5 * sig(z[size_t(want[size_t(j)])]) / s, 1e-6);
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(p[size_t(e)], sig(z[size_t(e)]), 1e-7);
  }
}

// d/dz of L = sum a[t,j] w[t,j] + sum g[s,e] q[t,e] (w the scaled, maybe renormalised sigmoid weights; q the token's
// sigmoid scores normalised to sum 1; the routing held fixed) by central differences in double, against
// moe_group_router_backward.
TEST(MoeGroupRouter, BackwardMatchesFiniteDifferences) {
  auto be = cpu();
  const int64_t n = 6, E = 8, k = 3, T = 3;
  const float scale = 2.5f;
  const auto z = randn(size_t(n * E), 12, 1.5f), a = randn(size_t(n * k), 13), g = randn(size_t(n / T * E), 14);
  for (bool renorm : {true, false}) {
    const Backend::GroupRouting r{k, 4, 2, renorm, scale};
    Tensor logits = make(*be, {n, E}, z), probs(*be, {n, E}), experts(*be, {n, k}, DType::i32), weights(*be, {n, k});
    be->moe_group_router_forward(logits, r, probs, experts, weights);
    Tensor dw = make(*be, {n, k}, a), sg = make(*be, {n / T, E}, g), dz(*be, {n, E});
    be->moe_group_router_backward(probs, experts, dw, r, sg, T, dz);
    const auto got = get<float>(*be, dz);
    const auto ex = get<int32_t>(*be, experts);
    for (int64_t t = 0; t < n; ++t) {
      auto loss = [&](const std::vector<double>& zt) {
        std::vector<double> p;
        double sum = 0, top = 0;
        for (double v : zt) p.push_back(1 / (1 + std::exp(-v))), sum += p.back();
        for (int64_t j = 0; j < k; ++j) top += p[size_t(ex[size_t(t * k + j)])];
        double L = 0;
        for (int64_t j = 0; j < k; ++j)
          L += a[size_t(t * k + j)] * scale * p[size_t(ex[size_t(t * k + j)])] / (renorm ? top : 1.0);
        for (int64_t e = 0; e < E; ++e) L += g[size_t(t / T * E + e)] * p[size_t(e)] / sum;
        return L;
      };
      expect_central_differences(got, z, t, E, loss, renorm ? " (renormalised)" : "");
    }
  }
}

// Under bf16 the router reads bf16 logits into f32: on bf16 values it is the f32 router exactly (probabilities,
// choices, weights); its logits' gradient is the f32 one rounded once to bf16.
TEST(MoeGroupRouter, Bf16LogitsMatchF32) {
  auto be = cpu();
  const int64_t n = 12, E = 8, k = 3, T = 4;
  auto z = randn(size_t(n * E), 15, 1.5f);
  for (float& v : z) v = round_bf16(v);
  const Backend::GroupRouting r{k, 4, 2, true, 2.5f};
  std::vector<std::vector<float>> probs, weights, dz;
  std::vector<std::vector<int32_t>> experts;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor logits(*be, {n, E}, dt), p(*be, {n, E}), ex(*be, {n, k}, DType::i32), w(*be, {n, k}), d(*be, {n, E}, dt);
    be->upload_f32(logits, z.data());
    be->moe_group_router_forward(logits, r, p, ex, w);
    Tensor dw = make(*be, {n, k}, randn(size_t(n * k), 16)), sg = make(*be, {n / T, E}, randn(size_t(n / T * E), 17));
    be->moe_group_router_backward(p, ex, dw, r, sg, T, d);
    Tensor d32(*be, {n, E});
    be->convert(d, d32);
    probs.push_back(get<float>(*be, p));
    weights.push_back(get<float>(*be, w));
    experts.push_back(get<int32_t>(*be, ex));
    dz.push_back(get<float>(*be, d32));
  }
  EXPECT_EQ(probs[0], probs[1]);
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_EQ(experts[0], experts[1]);
  for (size_t i = 0; i < dz[0].size(); ++i) EXPECT_EQ(dz[1][i], round_bf16(dz[0][i])) << i;
}

// C = 3 takes only the kernels' column tails; 37 one 16-lane pass of the backward's dot products and a tail; 300 a full
// 256-column block of the forward and a partial one.
TEST(MoeCombine, ForwardAndBackwardMatchNaive) {
  auto be = cpu();
  for (const int64_t C : {3, 37, 300}) {
    const int64_t n = 5, k = 2, R = n * k;
    const auto rows = randn(size_t(R * C), 5), w = randn(size_t(n * k), 6), dy = randn(size_t(n * C), 7);
    std::vector<int32_t> pos(static_cast<size_t>(R));
    std::iota(pos.begin(), pos.end(), 0);
    std::reverse(pos.begin(), pos.end());  // any permutation of the rows
    Tensor trows = make(*be, {R, C}, rows), tw = make(*be, {n, k}, w), tdy = make(*be, {n, C}, dy);
    Tensor tpos(*be, {n, k}, DType::i32), y(*be, {n, C}), drows(*be, {R, C}), dw(*be, {n, k});
    be->upload(tpos, pos.data());
    be->moe_combine(trows, tpos, tw, y);
    be->moe_combine_backward(tdy, trows, tpos, tw, drows, dw);
    const auto gy = get<float>(*be, y), gdr = get<float>(*be, drows), gdw = get<float>(*be, dw);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = pos[size_t(t * k + j)];
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          dot += double(dy[size_t(t * C + c)]) * rows[size_t(r * C + c)];
          EXPECT_NEAR(gdr[size_t(r * C + c)], double(w[size_t(t * k + j)]) * dy[size_t(t * C + c)], 1e-6) << "C " << C;
        }
        EXPECT_NEAR(gdw[size_t(t * k + j)], dot, 1e-5 * (1 + std::fabs(dot))) << "C " << C;
      }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j)
          s += double(w[size_t(t * k + j)]) * rows[size_t(pos[size_t(t * k + j)] * C + c)];
        EXPECT_NEAR(gy[size_t(t * C + c)], s, 1e-5) << "C " << C << " row " << t << " column " << c;
      }
  }
}

namespace {

// A MoE MLP of E experts over C channels with positive inputs, so that a router whose rows are constants routes
// every token alike: row e = bias[e] gives logits bias[e] * sum(x).
struct MoeFixture {
  static constexpr int64_t C = 8, E = 4, F = 6, T = 4, n = 8;
  std::unique_ptr<Backend> be = cpu();
  std::deque<Param> params;
  BlockSpec spec;
  std::vector<float> x;

  MoeFixture(int64_t k, const std::vector<float>& router_rows) {
    spec.kind = BlockKind::llama_layer;
    spec.in = spec.out = C;
    spec.seq_len = T;
    spec.moe = {E, k, F, true, 0.1, 0.01, 0};
    auto add = [&](Shape s, std::vector<float> v) {
      Param& p = params.emplace_back();
      p.value = make(*be, s, v);
      p.grad = Tensor(*be, s);
      be->fill(p.grad, 0.f);
      p.shape = p.full_shape = s;
    };
    std::vector<float> r;
    for (int64_t e = 0; e < E; ++e) r.insert(r.end(), size_t(C), router_rows[size_t(e)]);
    add({E, C}, r);
    for (int64_t e = 0; e < E; ++e) {
      add({F, C}, randn(size_t(F * C), uint64_t(10 + 3 * e), 0.5f));
      add({F, C}, randn(size_t(F * C), uint64_t(11 + 3 * e), 0.5f));
      add({C, F}, randn(size_t(C * F), uint64_t(12 + 3 * e), 0.5f));
    }
    x = randn(size_t(n * C), 9);
    for (auto& v : x) v = std::abs(v) + 0.1f;
  }
  std::vector<Param*> ptrs() {
    std::vector<Param*> p;
    for (Param& q : params) p.push_back(&q);
    return p;
  }
  // SwiGLU_e(x[t]) in double.
  std::vector<double> expert(int64_t e, int64_t t) {
    const auto g = get<float>(*be, params[size_t(1 + 3 * e)].value), u = get<float>(*be, params[size_t(2 + 3 * e)].value),
               d = get<float>(*be, params[size_t(3 + 3 * e)].value);
    std::vector<double> h(static_cast<size_t>(F)), y(static_cast<size_t>(C), 0.0);
    for (int64_t f = 0; f < F; ++f) {
      double a = 0, b = 0;
      for (int64_t c = 0; c < C; ++c) a += double(g[size_t(f * C + c)]) * x[size_t(t * C + c)], b += double(u[size_t(f * C + c)]) * x[size_t(t * C + c)];
      h[size_t(f)] = a / (1 + std::exp(-a)) * b;
    }
    for (int64_t c = 0; c < C; ++c)
      for (int64_t f = 0; f < F; ++f) y[size_t(c)] += double(d[size_t(c * F + f)]) * h[size_t(f)];
    return y;
  }
  // Runs forward and backward; returns y and the router statistics.
  std::vector<float> run(RouterStats& stats) {
    auto p = ptrs();
    MoeMlp moe(spec, p);
    std::vector<Tensor> saved;
    allocate_buffers(*be, MoeMlp::saved_shapes(spec, n), saved);
    Tensor tx = make(*be, {n, C}, x), y(*be, {n, C}), dx(*be, {n, C});
    Tensor dy = make(*be, {n, C}, randn(size_t(n * C), 99));
    moe.forward(*be, tx, y, saved.data());
    moe.backward_input(*be, dy, dx, saved.data());
    moe.backward_weight(*be, tx, saved.data());
    for (float v : get<float>(*be, dx)) EXPECT_TRUE(std::isfinite(v));
    std::vector<RouterStats> st;
    moe.take_stats(st);
    stats = st.at(0);
    return get<float>(*be, y);
  }
  double grad_abs_sum(int64_t e) {
    double s = 0;
    for (int i = 1; i <= 3; ++i)
      for (float v : get<float>(*be, params[size_t(3 * e + i)].grad)) s += std::abs(v);
    return s;
  }
};

}  // namespace

// k = 1 and a router that prefers expert 0 for every token: the layer is expert 0 (weight 1), three experts get no
// token and no gradient, and nothing else changes.
TEST(MoeMlp, EveryTokenPicksOneExpert) {
  MoeFixture f(1, {2.f, 0.f, 0.f, 0.f});
  RouterStats st;
  const auto y = f.run(st);
  for (int64_t t = 0; t < f.n; ++t) {
    const auto want = f.expert(0, t);
    for (int64_t c = 0; c < f.C; ++c) EXPECT_NEAR(y[size_t(t * f.C + c)], want[size_t(c)], 1e-5) << t << ", " << c;
  }
  EXPECT_EQ(st.tokens, (std::vector<double>{double(f.n), 0, 0, 0}));
  EXPECT_GT(f.grad_abs_sum(0), 0);
  for (int64_t e = 1; e < f.E; ++e) EXPECT_EQ(f.grad_abs_sum(e), 0) << "expert " << e << " received no token";
  EXPECT_GT(st.aux_sum, 0);
}

// k = 2 with experts 2 and 3 never chosen: the output is the renormalised mixture of experts 0 and 1.
TEST(MoeMlp, ExpertsWithoutTokens) {
  MoeFixture f(2, {2.f, 1.f, 0.f, 0.f});
  RouterStats st;
  const auto y = f.run(st);
  for (int64_t t = 0; t < f.n; ++t) {
    double s = 0;
    for (int64_t c = 0; c < f.C; ++c) s += f.x[size_t(t * f.C + c)];
    const double w0 = 1 / (1 + std::exp(-s));  // p0 / (p0 + p1) = sigmoid(2 s - s)
    const auto e0 = f.expert(0, t), e1 = f.expert(1, t);
    for (int64_t c = 0; c < f.C; ++c)
      EXPECT_NEAR(y[size_t(t * f.C + c)], w0 * e0[size_t(c)] + (1 - w0) * e1[size_t(c)], 1e-5) << t << ", " << c;
  }
  EXPECT_EQ(st.tokens, (std::vector<double>{double(f.n), double(f.n), 0, 0}));
  EXPECT_GT(f.grad_abs_sum(1), 0);
  EXPECT_EQ(f.grad_abs_sum(2), 0);
  EXPECT_EQ(f.grad_abs_sum(3), 0);
}
