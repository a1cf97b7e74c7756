// Every layer's backward (input and weight gradients) against central finite differences of a
// double-precision re-implementation of its forward, as torch.autograd.gradcheck does.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backend/backend.hpp"
#include "core/rng.hpp"
#include "model/layer.hpp"

using namespace relay;

namespace {

using Vec = std::vector<double>;

// Double-precision forward of each layer type given x (rows, in) and the parameters.
Vec forward_double(const std::string& type, const Vec& x, int64_t rows, int64_t in, int64_t out, const Vec& w, const Vec& b) {
  Vec y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    if (type == "linear") {
      for (int64_t o = 0; o < out; ++o) {
        double s = b[size_t(o)];
        for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
        y[size_t(r * out + o)] = s;
      }
    } else if (type == "layernorm") {
      double mu = 0, var = 0;
      for (int64_t i = 0; i < in; ++i) mu += x[size_t(r * in + i)];
      mu /= double(in);
      for (int64_t i = 0; i < in; ++i) var += std::pow(x[size_t(r * in + i)] - mu, 2);
      var /= double(in);
      for (int64_t i = 0; i < in; ++i)
        y[size_t(r * in + i)] = (x[size_t(r * in + i)] - mu) / std::sqrt(var + 1e-5) * w[size_t(i)] + b[size_t(i)];
    } else {
      for (int64_t i = 0; i < in; ++i) {
        double v = x[size_t(r * in + i)];
        y[size_t(r * in + i)] = type == "relu" ? (v > 0 ? v : 0) : type == "tanh" ? std::tanh(v)
                                                                  : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      }
    }
  }
  return y;
}

void gradcheck(const LayerConfig& cfg, int64_t rows, int64_t in) {
  auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
  LayerShape s{in, cfg.type == "linear" ? cfg.out : in};
  auto layer = make_layer(*be, cfg, 3, s, 7);
  Rng rng(5, 1);
  Vec x(size_t(rows * in)), R(size_t(rows * s.out));  // loss = sum(y * R)
  for (auto& v : x) v = rng.normal() * 1.5;
  for (auto& v : R) v = rng.normal();
  Vec w, b;
  auto& ps = layer->params();
  if (!ps.empty()) {
    // Random, non-trivial parameters (layernorm starts at 1 and 0).
    for (auto& p : ps) {
      std::vector<float> h(size_t(p.value.numel()));
      for (auto& v : h) v = float(rng.normal() * 0.5 + (p.name.find("weight") != std::string::npos && cfg.type == "layernorm" ? 1.0 : 0.0));
      be->upload(p.value, h.data());
      p.grad = Tensor(*be, p.value.shape());
      be->fill(p.grad, 0.f);
      (p.name.find("weight") != std::string::npos ? w : b) = Vec(h.begin(), h.end());
    }
  }
  // Analytic gradients from the float layer.
  std::vector<float> xf(x.begin(), x.end()), Rf(R.begin(), R.end());
  Tensor tx(*be, {rows, in}), ty(*be, {rows, s.out}), tdy(*be, {rows, s.out}), tdx(*be, {rows, in});
  be->upload(tx, xf.data());
  be->upload(tdy, Rf.data());
  LayerSaved saved;
  layer->allocate_saved(*be, rows, saved);
  layer->forward(*be, tx, ty, saved);
  layer->backward_input(*be, tx, tdy, tdx, saved);
  layer->backward_weight(*be, tx, tdy, saved);
  // The float forward agrees with the double one.
  std::vector<float> yf(size_t(ty.numel()));
  be->download(yf.data(), ty);
  Vec yd = forward_double(cfg.type, x, rows, in, s.out, w, b);
  for (size_t i = 0; i < yf.size(); ++i) ASSERT_NEAR(yf[i], yd[i], 1e-4 * (1 + std::abs(yd[i]))) << cfg.type << " y " << i;

  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec y = forward_double(cfg.type, xx, rows, in, s.out, ww, bb);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * R[i];
    return l;
  };
  const double h = 1e-6;
  auto check = [&](Vec& v, const Tensor& analytic, const char* what) {
    std::vector<float> g(size_t(analytic.numel()));
    be->download(g.data(), analytic);
    for (size_t i = 0; i < v.size(); ++i) {
      double keep = v[i];
      v[i] = keep + h;
      double lp = loss(x, w, b);
      v[i] = keep - h;
      double lm = loss(x, w, b);
      v[i] = keep;
      double num = (lp - lm) / (2 * h);
      ASSERT_NEAR(g[i], num, 2e-4 * (1 + std::abs(num))) << cfg.type << " d" << what << "[" << i << "]";
    }
  };
  if (cfg.type != "relu") check(x, tdx, "x");  // relu's kink makes central differences unreliable at 0 only;
  else {                                         // away from 0 it is exact, checked directly:
    std::vector<float> g(size_t(tdx.numel()));
    be->download(g.data(), tdx);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(g[i], x[i] > 0 ? Rf[i] : 0.f);
  }
  if (!ps.empty()) {
    check(w, ps[0].grad, "weight");
    check(b, ps[1].grad, "bias");
  }
}

}  // namespace

TEST(LayerGradcheck, Linear) { gradcheck({"linear", 7, 1e-5}, 5, 9); }
TEST(LayerGradcheck, Gelu) { gradcheck({"gelu", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, Tanh) { gradcheck({"tanh", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, Relu) { gradcheck({"relu", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, LayerNorm) { gradcheck({"layernorm", 0, 1e-5}, 6, 13); }

TEST(LayerInit, TorchDefaultsAndPureFunctionOfSeedAndIndex) {
  auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
  auto a = make_layer(*be, {"linear", 64, 1e-5}, 2, {100, 64}, 9);
  auto b = make_layer(*be, {"linear", 64, 1e-5}, 2, {100, 64}, 9);
  auto c = make_layer(*be, {"linear", 64, 1e-5}, 3, {100, 64}, 9);
  std::vector<float> wa(6400), wb(6400), wc(6400);
  be->download(wa.data(), a->params()[0].value);
  be->download(wb.data(), b->params()[0].value);
  be->download(wc.data(), c->params()[0].value);
  EXPECT_EQ(wa, wb);  // same (seed, index): same values, whatever else exists
  EXPECT_NE(wa, wc);  // another index: other values
  double bound = 1.0 / std::sqrt(100.0), mean = 0, sq = 0;
  for (float v : wa) {
    EXPECT_LE(std::abs(v), bound);
    mean += v;
    sq += double(v) * v;
  }
  mean /= 6400;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / 6400, bound * bound / 3, 0.1 * bound * bound / 3);  // variance of U(-b, b)
  auto ln = make_layer(*be, {"layernorm", 0, 1e-5}, 4, {8, 8}, 9);
  std::vector<float> g(8), bb(8);
  be->download(g.data(), ln->params()[0].value);
  be->download(bb.data(), ln->params()[1].value);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(g[size_t(i)], 1.f);
    EXPECT_EQ(bb[size_t(i)], 0.f);
  }
  EXPECT_EQ(a->params()[0].name, "2.weight");
  EXPECT_EQ(a->params()[1].name, "2.bias");
}
