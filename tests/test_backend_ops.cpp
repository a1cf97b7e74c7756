// Every Backend op of the CUDA backend against the CPU reference backend (ggml's test-backend-ops):
// one table of (op, shape, precision) cases, each run from the same seeded inputs on both backends
// and compared output by output with the tolerance stated in its row; then a small MLP's forward,
// backward and SGD step composed from the same ops. Skipped where there is no CUDA device.
//
// Error measure: max |cuda - cpu| over an output, divided by max |cpu| over that output (errors
// relative to the output's scale, so GEMM sums that cancel to near zero do not inflate it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/rng.hpp"

namespace relay {
namespace {

#ifdef RELAY_HAVE_CUDA
constexpr const char* kNoCuda = "no CUDA device: cuda_device_count() == 0 (check CUDA_VISIBLE_DEVICES)";
#else
constexpr const char* kNoCuda = "no CUDA device: this build has no CUDA backend (RELAY_CUDA=OFF or no toolkit)";
#endif

// Tolerances, relative to each output's largest reference magnitude.
constexpr double kTolExact = 0.0;    // copies, fills, argmax indices
constexpr double kTolFp32 = 1e-5;    // fp32 kernels and fp32 GEMMs (no TF32)
constexpr double kTolBf16 = 2e-2;    // bf16 GEMM inputs (8-bit mantissa) against the fp32 reference
constexpr double kTolSumSq = 1e-9;   // both backends square and sum in double
constexpr double kTolMlp = 1e-4;     // a chain of ~15 fp32 ops
constexpr double kTolMlpBf16 = 5e-2;  // the same chain with bf16 GEMMs
constexpr double kTolAttention = 2e-5;  // fp32 dot products and softmax sums of up to T terms, in
                                        // another order (and expf) than the CPU's

struct Output {
  std::string name;
  std::vector<double> values;
};

struct OpCase {
  std::string name;  // also the test's name: [A-Za-z0-9_]
  Precision precision;
  double tolerance;
  std::function<std::vector<Output>(Backend&)> run;  // makes its inputs from fixed seeds
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// --- inputs and outputs ------------------------------------------------------------------------

std::vector<float> random_values(int64_t n, uint64_t seed, double lo, double hi) {
  Rng rng(seed, 0);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

Tensor input(Backend& be, const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t(be, shape);
  std::vector<float> v = random_values(t.numel(), seed, lo, hi);
  be.upload(t, v.data());
  return t;
}

// Values from {0, 1, 2, 3}: many ties, to check that the first maximum wins.
Tensor input_with_ties(Backend& be, const Shape& shape, uint64_t seed) {
  Tensor t(be, shape);
  std::vector<float> v = random_values(t.numel(), seed, 0.0, 4.0);
  for (float& x : v) x = std::floor(x);
  be.upload(t, v.data());
  return t;
}

Tensor class_targets(Backend& be, int64_t n, int64_t classes, uint64_t seed) {
  Tensor t(be, {n}, DType::i32);
  Rng rng(seed, 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  be.upload(t, v.data());
  return t;
}

Output out(Backend& be, const std::string& name, const Tensor& t) {
  Output o{name, std::vector<double>(static_cast<size_t>(t.numel()))};
  if (t.dtype() == DType::i32) {
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = v[i];
  } else {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = v[i];
  }
  return o;
}

std::string dims(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
  return r;
}

const char* act_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::tanh: return "tanh";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

// --- the table ---------------------------------------------------------------------------------

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  const std::vector<Shape> shapes = {{1, 1}, {3, 7}, {127, 513}, {256, 1024}};
  auto add = [&](std::string name, double tol, std::function<std::vector<Output>(Backend&)> run,
                 Precision p = Precision::fp32) { cases.push_back({std::move(name), p, tol, std::move(run)}); };

  // memory: upload/download, pinned host buffers, copies (also of row views), fill
  for (const Shape& s : shapes) {
    const std::string d = dims(s);
    add("upload_download_" + d, kTolExact, [s](Backend& be) { return std::vector{out(be, "x", input(be, s, 1))}; });
    add("upload_pinned_" + d, kTolExact, [s](Backend& be) {
      Tensor t(be, s);
      std::vector<float> v = random_values(t.numel(), 2, -1, 1);
      std::shared_ptr<std::byte> host = be.allocate_host(t.bytes());
      std::memcpy(host.get(), v.data(), t.bytes());
      be.upload(t, host.get());
      return std::vector{out(be, "x", t)};
    });
    add("copy_" + d, kTolExact, [s](Backend& be) {
      Tensor src = input(be, s, 3), dst(be, s);
      be.copy(dst, src);
      return std::vector{out(be, "dst", dst)};
    });
    add("fill_" + d, kTolExact, [s](Backend& be) {
      Tensor t = input(be, s, 4);
      be.fill(t, 0.375f);
      return std::vector{out(be, "x", t)};
    });
  }
  add("copy_row_view_9x5", kTolExact, [](Backend& be) {
    Tensor src = input(be, {9, 5}, 5), dst = input(be, {9, 5}, 6);
    Tensor dst_rows = dst.rows(2, 4);
    be.copy(dst_rows, src.rows(5, 4));
    return std::vector{out(be, "dst", dst), out(be, "dst_rows", dst_rows)};
  });

  // matmul: y (m, n) = alpha op(a) op(b) + beta y, every transpose combination
  struct Mnk { int64_t m, n, k; };
  const std::vector<Mnk> gemms = {{1, 1, 1}, {3, 7, 5}, {127, 513, 65}, {256, 1024, 512}, {33, 17, 1023}};
  for (const Mnk& g : gemms) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const std::string base = "matmul_" + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                               "_" + (ta ? "t" : "n") + (tb ? "t" : "n");
      auto run = [g, ta, tb](float alpha, float beta) {
        return [=](Backend& be) {
          Tensor a = input(be, ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, 10);
          Tensor b = input(be, tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, 11);
          Tensor y = input(be, {g.m, g.n}, 12);
          be.matmul(a, ta, b, tb, y, alpha, beta);
          return std::vector{out(be, "y", y)};
        };
      };
      add(base + "_fp32", kTolFp32, run(1.0f, 0.0f));
      add(base + "_bf16", kTolBf16, run(1.0f, 0.0f), Precision::bf16);
      if (t == 0) add(base + "_alpha_beta_fp32", kTolFp32, run(0.5f, 2.0f));
    }
  }

  for (const Shape& s : shapes) {
    const std::string d = dims(s);
    const int64_t n = s[0], f = s[1];

    // bias
    add("add_bias_" + d, kTolFp32, [=](Backend& be) {
      Tensor y = input(be, s, 20), bias = input(be, {f}, 21);
      be.add_bias(y, bias);
      return std::vector{out(be, "y", y)};
    });
    for (float beta : {0.0f, 1.0f}) {
      add("bias_grad_" + d + (beta == 0.0f ? "_beta0" : "_beta1"), kTolFp32, [=](Backend& be) {
        Tensor dy = input(be, s, 22), db = input(be, {f}, 23);
        be.bias_grad(dy, db, beta);
        return std::vector{out(be, "db", db)};
      });
    }

    // activations; the backward also in place (dx aliasing dy)
    for (Activation act : {Activation::relu, Activation::gelu, Activation::tanh, Activation::gelu_tanh}) {
      const std::string a = act_name(act);
      add(a + "_forward_" + d, kTolFp32, [=](Backend& be) {
        Tensor x = input(be, s, 30, -4, 4), y(be, s);
        be.activation_forward(act, x, y);
        return std::vector{out(be, "y", y)};
      });
      add(a + "_backward_" + d, kTolFp32, [=](Backend& be) {
        Tensor x = input(be, s, 31, -4, 4), dy = input(be, s, 32), dx(be, s);
        be.activation_backward(act, x, dy, dx);
        return std::vector{out(be, "dx", dx)};
      });
      add(a + "_backward_inplace_" + d, kTolFp32, [=](Backend& be) {
        Tensor x = input(be, s, 33, -4, 4), g = input(be, s, 34);
        be.activation_backward(act, x, g, g);
        return std::vector{out(be, "dx", g)};
      });
    }

    // scale and sum of squares
    add("scale_" + d, kTolFp32, [=](Backend& be) {
      Tensor x = input(be, s, 40);
      be.scale(x, -0.3f);
      return std::vector{out(be, "x", x)};
    });
    add("sum_squares_" + d, kTolSumSq, [=](Backend& be) {
      Tensor x = input(be, s, 41, -3, 3);
      return std::vector{Output{"sum", {be.sum_squares(x)}}};
    });

    // layernorm over the last dimension (inputs off-centre, so the mean matters)
    add("layernorm_forward_" + d, kTolFp32, [=](Backend& be) {
      Tensor x = input(be, s, 50, 1, 5), gamma = input(be, {f}, 51, 0.5, 1.5), beta = input(be, {f}, 52);
      Tensor y(be, s), mean(be, {n}), rstd(be, {n});
      be.layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
      return std::vector{out(be, "y", y), out(be, "mean", mean), out(be, "rstd", rstd)};
    });
    add("layernorm_backward_" + d, kTolFp32, [=](Backend& be) {
      Tensor x = input(be, s, 53, 1, 5), gamma = input(be, {f}, 54, 0.5, 1.5), beta = input(be, {f}, 55);
      Tensor y(be, s), mean(be, {n}), rstd(be, {n}), dx(be, s);
      be.layernorm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
      Tensor dy = input(be, s, 56);
      Tensor dgamma = input(be, {f}, 57), dbeta = input(be, {f}, 58);  // accumulated into
      be.layernorm_backward_input(dy, x, gamma, mean, rstd, dx);
      be.layernorm_backward_weight(dy, x, mean, rstd, dgamma, dbeta);
      return std::vector{out(be, "dx", dx), out(be, "dgamma", dgamma), out(be, "dbeta", dbeta)};
    });

    // losses: (n, classes) = s
    for (bool with_grad : {false, true}) {
      const std::string g = with_grad ? "" : "_no_grad";
      add("cross_entropy_" + d + g, kTolFp32, [=](Backend& be) {
        Tensor logits = input(be, s, 60, -6, 6), targets = class_targets(be, n, f, 61), losses(be, {n});
        Tensor dlogits(be, s);
        be.cross_entropy(logits, targets, 1.0f / static_cast<float>(n), losses, with_grad ? &dlogits : nullptr);
        std::vector<Output> o{out(be, "losses", losses)};
        if (with_grad) o.push_back(out(be, "dlogits", dlogits));
        return o;
      });
      // Vocabulary-parallel cross-entropy's three steps, as one tp rank holding columns [3, 3 + f) of
      // f + 7 (targets below 3 are another rank's); the totals stand in for the group's all-reduces.
      add("vocab_parallel_cross_entropy_" + d + g, kTolFp32, [=](Backend& be) {
        Tensor logits = input(be, s, 64, -6, 6), targets = class_targets(be, n, f + 7, 65), losses(be, {n});
        Tensor mx(be, {n}), partial(be, {n, 2}), dlogits(be, s);
        be.row_max(logits, mx);
        be.cross_entropy_partial(logits, targets, 3, mx, partial);
        Tensor total = input(be, {n, 2}, 66, 1, 2);
        be.cross_entropy_finish(logits, targets, 3, mx, total, 1.0f / static_cast<float>(n), losses,
                                with_grad ? &dlogits : nullptr);
        std::vector<Output> o{out(be, "row_max", mx), out(be, "partial", partial), out(be, "losses", losses)};
        if (with_grad) o.push_back(out(be, "dlogits", dlogits));
        return o;
      });
      add("mse_" + d + g, kTolFp32, [=](Backend& be) {
        Tensor pred = input(be, s, 62), target = input(be, s, 63), losses(be, {n}), dpred(be, s);
        be.mse(pred, target, 1.0f / static_cast<float>(n), losses, with_grad ? &dpred : nullptr);
        std::vector<Output> o{out(be, "losses", losses)};
        if (with_grad) o.push_back(out(be, "dpred", dpred));
        return o;
      });
    }
    add("argmax_" + d, kTolExact, [=](Backend& be) {
      Tensor logits = input(be, s, 64), idx(be, {n}, DType::i32);
      be.argmax(logits, idx);
      return std::vector{out(be, "argmax", idx)};
    });
    add("argmax_ties_" + d, kTolExact, [=](Backend& be) {
      Tensor logits = input_with_ties(be, s, 65), idx(be, {n}, DType::i32);
      be.argmax(logits, idx);
      return std::vector{out(be, "argmax", idx)};
    });

    // optimizers: three steps, each with a new gradient
    add("adamw_3_steps_" + d, kTolFp32, [=](Backend& be) {
      Tensor p = input(be, s, 70), m(be, s), v(be, s);
      be.fill(m, 0.0f);
      be.fill(v, 0.0f);
      for (int64_t step = 1; step <= 3; ++step) {
        Tensor g = input(be, s, 70 + static_cast<uint64_t>(step), -0.1, 0.1);
        Tensor no_work;
        be.adamw_step(p, g, m, v, AdamWArgs{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step}, no_work);
      }
      return std::vector{out(be, "param", p), out(be, "exp_avg", m), out(be, "exp_avg_sq", v)};
    });
    for (float momentum : {0.0f, 0.9f}) {
      add(std::string("sgd_3_steps_") + (momentum == 0.0f ? "plain_" : "momentum_") + d, kTolFp32, [=](Backend& be) {
        Tensor p = input(be, s, 80);
        Tensor buf = momentum != 0.0f ? Tensor(be, s) : Tensor();  // undefined without momentum
        for (int step = 0; step < 3; ++step) {
          Tensor g = input(be, s, 81 + static_cast<uint64_t>(step));
          Tensor no_work;
          be.sgd_step(p, g, buf, SgdArgs{0.05f, momentum, 0.01f, step == 0}, no_work);
        }
        std::vector<Output> o{out(be, "param", p)};
        if (momentum != 0.0f) o.push_back(out(be, "momentum_buffer", buf));
        return o;
      });
    }
  }
  // residual add, also in place (y aliasing a)
  for (const Shape& s : shapes) {
    add("add_" + dims(s), kTolFp32, [s](Backend& be) {
      Tensor a = input(be, s, 90), b = input(be, s, 91), y(be, s);
      be.add(a, b, y);
      be.add(a, b, a);
      return std::vector{out(be, "y", y), out(be, "a_inplace", a)};
    });
  }
  // cross-entropy over a vocabulary, its gradient written over the logits (a language model's loss)
  for (int64_t V : {int64_t(65), int64_t(50257)}) {
    add("cross_entropy_inplace_16x" + std::to_string(V), kTolFp32, [V](Backend& be) {
      Tensor logits = input(be, {16, V}, 92, -8, 8), targets = class_targets(be, 16, V, 93), losses(be, {16});
      be.cross_entropy(logits, targets, 1.0f / 16, losses, &logits);
      return std::vector{out(be, "losses", losses), out(be, "dlogits", logits)};
    });
  }
  // GPT-2: embedding with repeated tokens (its backward accumulates), attention, KV-cache decoding
  struct Gpt { int64_t B, T, H, C, V; };
  for (Gpt g : {Gpt{1, 1, 1, 4, 7}, Gpt{2, 5, 2, 6, 11}, Gpt{3, 64, 4, 64, 300}, Gpt{2, 256, 12, 768, 50257}}) {
    const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) + "_C" +
                          std::to_string(g.C);
    const int64_t n = g.B * g.T;
    add("embedding_forward_backward_" + d + "_V" + std::to_string(g.V), kTolFp32, [g, n](Backend& be) {
      Tensor tok = class_targets(be, n, std::min<int64_t>(g.V, 5), 94);  // ids 0..4: many repeats
      Tensor wte = input(be, {g.V, g.C}, 95), wpe = input(be, {g.T, g.C}, 96), y(be, {n, g.C});
      be.embedding_forward(tok, wte, wpe, g.T, y);
      Tensor dy = input(be, {n, g.C}, 97), dwte = input(be, {g.V, g.C}, 98), dwpe = input(be, {g.T, g.C}, 99);
      be.embedding_backward(tok, dy, g.T, dwte, dwpe);
      return std::vector{out(be, "y", y), out(be, "dwte", dwte), out(be, "dwpe", dwpe)};
    });
    // Vocabulary-parallel: this rank holds rows [2, 2 + V/2 + 1) and adds no positions.
    add("embedding_vocab_shard_" + d + "_V" + std::to_string(g.V), kTolFp32, [g, n](Backend& be) {
      const int64_t rows = g.V / 2 + 1;
      Tensor tok = class_targets(be, n, std::min<int64_t>(g.V, 5), 103);
      Tensor wte = input(be, {rows, g.C}, 104), y(be, {n, g.C}), none;
      be.embedding_forward(tok, wte, none, g.T, y, 2);
      Tensor dy = input(be, {n, g.C}, 105), dwte = input(be, {rows, g.C}, 106);
      be.embedding_backward(tok, dy, g.T, dwte, none, 2);
      return std::vector{out(be, "y", y), out(be, "dwte", dwte)};
    });
    add("attention_forward_backward_" + d, kTolAttention, [g, n](Backend& be) {
      Tensor qkv = input(be, {n, 3 * g.C}, 100, -2, 2), att(be, {g.B, g.H, g.T, g.T}), y(be, {n, g.C});
      be.attention_forward(qkv, g.B, g.T, g.H, att, y);
      Tensor dy = input(be, {n, g.C}, 101), dqkv = input(be, {n, 3 * g.C}, 102);  // overwritten
      be.attention_backward(dy, qkv, att, g.B, g.T, g.H, dqkv);
      return std::vector{out(be, "out", y), out(be, "att", att), out(be, "dqkv", dqkv)};
    });
    if (g.T <= 64)
      add("attention_decode_" + d, kTolAttention, [g](Backend& be) {
        Tensor qkv = input(be, {g.T, 3 * g.C}, 103, -2, 2);  // positions of one sequence, decoded one by one
        Tensor kc(be, {1, g.T, g.C}), vc(be, {1, g.T, g.C}), o(be, {g.T, g.C});
        for (int64_t t = 0; t < g.T; ++t) {
          Tensor ot = o.rows(t, 1);
          be.attention_decode(qkv.rows(t, 1), kc, vc, t, g.H, ot);
        }
        return std::vector{out(be, "out", o), out(be, "kcache", kc), out(be, "vcache", vc)};
      });
  }
  return cases;
}

// --- comparison --------------------------------------------------------------------------------

void expect_close(const std::string& name, const Output& ref, const Output& got, double tol) {
  ASSERT_EQ(ref.values.size(), got.values.size()) << name << ": output " << ref.name << " sizes differ";
  double scale = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < ref.values.size(); ++i) {
    const double r = ref.values[i], g = got.values[i];
    if (std::isnan(r) || std::isnan(g)) {
      ASSERT_TRUE(std::isnan(r) && std::isnan(g))
          << name << ": output " << ref.name << "[" << i << "] cpu " << r << " vs cuda " << g;
      continue;
    }
    scale = std::max(scale, std::fabs(r));
    if (std::fabs(r - g) > worst) {
      worst = std::fabs(r - g);
      worst_at = i;
    }
  }
  const double err = scale > 0.0 ? worst / scale : worst;
  EXPECT_LE(err, tol) << name << ": output " << ref.name << " max |cuda - cpu| = " << worst << " at [" << worst_at
                      << "] (cpu " << ref.values[worst_at] << ", cuda " << got.values[worst_at]
                      << "), relative to max |cpu| = " << scale << ": " << err << " > tolerance " << tol;
}

Backend& cpu_backend() {
  static std::unique_ptr<Backend> be = make_backend(BackendOptions{Device::cpu, 1});
  return *be;
}

Backend& cuda_backend() {
  static std::unique_ptr<Backend> be = make_backend(BackendOptions{Device::cuda, 1});
  return *be;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(BackendOps, CudaMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  const OpCase& c = GetParam();
  std::vector<Output> ref = c.run(cpu_backend());  // the CPU reference is always fp32
  Backend& gpu = cuda_backend();
  gpu.set_precision(c.precision);
  std::vector<Output> got = c.run(gpu);
  gpu.set_precision(Precision::fp32);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i) expect_close(c.name, ref[i], got[i], c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(AllOps, BackendOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

// --- a small MLP: forward, backward and one SGD step, at the backend-op level -----------------
// x (n, in) -> linear1 -> gelu -> layernorm -> linear2 -> cross-entropy, weights (out, in) as torch.

std::vector<Output> mlp_step(Backend& be) {
  const int64_t n = 64, in = 37, hidden = 129, classes = 10;
  const float grad_scale = 1.0f / static_cast<float>(n);
  Tensor x = input(be, {n, in}, 90), targets = class_targets(be, n, classes, 91);
  Tensor w1 = input(be, {hidden, in}, 92, -0.3, 0.3), b1 = input(be, {hidden}, 93, -0.1, 0.1);
  Tensor gamma = input(be, {hidden}, 94, 0.8, 1.2), beta = input(be, {hidden}, 95, -0.1, 0.1);
  Tensor w2 = input(be, {classes, hidden}, 96, -0.3, 0.3), b2 = input(be, {classes}, 97, -0.1, 0.1);

  // forward
  Tensor h(be, {n, hidden}), a(be, {n, hidden}), z(be, {n, hidden}), logits(be, {n, classes});
  Tensor mean(be, {n}), rstd(be, {n}), losses(be, {n}), dlogits(be, {n, classes});
  be.matmul(x, false, w1, true, h, 1.0f, 0.0f);  // (n, hidden)
  be.add_bias(h, b1);
  be.activation_forward(Activation::gelu, h, a);
  be.layernorm_forward(a, gamma, beta, 1e-5f, z, mean, rstd);
  be.matmul(z, false, w2, true, logits, 1.0f, 0.0f);  // (n, classes)
  be.add_bias(logits, b2);
  be.cross_entropy(logits, targets, grad_scale, losses, &dlogits);

  // backward
  Tensor dw2(be, {classes, hidden}), db2(be, {classes}), dz(be, {n, hidden}), da(be, {n, hidden});
  Tensor dgamma(be, {hidden}), dbeta(be, {hidden}), dw1(be, {hidden, in}), db1(be, {hidden}), dx(be, {n, in});
  be.matmul(dlogits, true, z, false, dw2, 1.0f, 0.0f);  // (classes, hidden)
  be.bias_grad(dlogits, db2, 0.0f);
  be.matmul(dlogits, false, w2, false, dz, 1.0f, 0.0f);  // (n, hidden)
  be.fill(dgamma, 0.0f);
  be.fill(dbeta, 0.0f);
  be.layernorm_backward_weight(dz, a, mean, rstd, dgamma, dbeta);
  be.layernorm_backward_input(dz, a, gamma, mean, rstd, da);
  be.activation_backward(Activation::gelu, h, da, da);  // in place, as layers do
  be.matmul(da, true, x, false, dw1, 1.0f, 0.0f);        // (hidden, in)
  be.bias_grad(da, db1, 0.0f);
  be.matmul(da, false, w1, false, dx, 1.0f, 0.0f);       // (n, in)

  // update
  Tensor none;
  for (auto [p, g] : {std::pair{&w1, &dw1}, {&b1, &db1}, {&w2, &dw2}, {&b2, &db2}, {&gamma, &dgamma}, {&beta, &dbeta}})
    be.sgd_step(*p, *g, none, SgdArgs{0.1f, 0.0f, 0.0f, true}, none);
  const double grad_norm2 = be.sum_squares(dw1) + be.sum_squares(dw2);

  return {out(be, "losses", losses), out(be, "logits", logits), out(be, "dx", dx), out(be, "dw1", dw1),
          out(be, "db1", db1), out(be, "dgamma", dgamma), out(be, "dbeta", dbeta), out(be, "dw2", dw2),
          out(be, "db2", db2), out(be, "w1_after_step", w1), out(be, "w2_after_step", w2),
          Output{"grad_norm2", {grad_norm2}}};
}

TEST(BackendOpsMlp, ForwardBackwardStepMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  std::vector<Output> ref = mlp_step(cpu_backend());
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    Backend& gpu = cuda_backend();
    gpu.set_precision(p);
    std::vector<Output> got = mlp_step(gpu);
    gpu.set_precision(Precision::fp32);
    ASSERT_EQ(ref.size(), got.size());
    const std::string name = p == Precision::fp32 ? "mlp_fp32" : "mlp_bf16";
    for (size_t i = 0; i < ref.size(); ++i)
      expect_close(name, ref[i], got[i], p == Precision::fp32 ? kTolMlp : kTolMlpBf16);
  }
}

}  // namespace
}  // namespace relay
