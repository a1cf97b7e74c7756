// cpu::matmul (kernels/cpu/matmul.cpp) against a naive double-precision reference over every
// combination of transposes, input / output / bias types, alpha, beta and leading-dimension padding;
// plus its edge cases, its primitive cache, and its error on a CPU without bf16 support; and the CPU
// backend's fused linear (Backend::linear) against the unfused ops it replaces.
//
// Tolerances: f32 output: |got - ref| <= 1e-5 max |ref| (f32 accumulation over k <= 17 terms; bf16
// inputs multiply exactly in f32). bf16 output adds one round-to-nearest-even step, at most 2^-9 |ref|:
// |got - ref| <= 2^-8 |ref| + 1e-5 max |ref| (2x margin for the f32 error before rounding).
#include <gtest/gtest.h>

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/matmul.hpp"
#include "support/test_support.hpp"

namespace relay {
namespace {

constexpr double kF32Tol = 1e-5;          // relative to max |ref|
constexpr double kBf16Round = 1.0 / 256;  // relative to |ref|: one bf16 rounding (2^-9) with a 2x margin

// A (rows, cols) matrix stored with leading dimension ld in f32 or bf16. Padding columns hold `pad`
// (NaN for inputs, so reading one poisons the result) and must never change.
struct Stored {
  DType type = DType::f32;
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> f32;
  std::vector<bf16> b16;

  Stored(DType t, int64_t r, int64_t c, int64_t leading, float pad)
      : type(t), rows(r), cols(c), ld(std::max<int64_t>(leading, 1)) {  // BLAS: ld >= 1 even for no columns
    const size_t size = size_t(std::max<int64_t>(r, 1) * ld);
    if (t == DType::bf16)
      b16.assign(size, f32_to_bf16(pad));
    else
      f32.assign(size, pad);
  }
  void* data() { return type == DType::bf16 ? static_cast<void*>(b16.data()) : static_cast<void*>(f32.data()); }
  float at(int64_t i, int64_t j) const {
    const size_t idx = size_t(i * ld + j);
    return type == DType::bf16 ? bf16_to_f32(b16[idx]) : f32[idx];
  }
  void set(int64_t i, int64_t j, float v) {
    const size_t idx = size_t(i * ld + j);
    if (type == DType::bf16)
      b16[idx] = f32_to_bf16(v);
    else
      f32[idx] = v;
  }
  // Normal values, exactly representable in the storage type.
  void randomize(uint64_t stream) {
    Rng r(7, stream);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) set(i, j, float(r.normal()));
  }
  // Bit patterns of everything stored, for "padding never changes" checks.
  std::vector<uint32_t> bits_at_padding() const {
    std::vector<uint32_t> out;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = cols; j < ld; ++j) {
        float v = at(i, j);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        out.push_back(u);
      }
    return out;
  }
};

struct Shape {
  int64_t m, n, k;
};

// One call: a (m, k) or stored (k, m), b (k, n) or stored (n, k), c (m, n), optional bias (n).
struct Problem {
  cpu::MatmulArgs args;
  Stored a, b, c, bias;
  bool has_bias;
  std::vector<double> c0;  // c before the call (beta * c0 is part of the reference)

  Problem(const cpu::MatmulArgs& p, bool with_bias, int64_t pad, uint64_t seed)
      : args(p),
        a(p.ab_type, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, (p.trans_a ? p.m : p.k) + pad, NAN),
        b(p.ab_type, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, (p.trans_b ? p.k : p.n) + pad, NAN),
        c(p.c_type, p.m, p.n, p.n + pad, -7.f),
        bias(p.bias_type, 1, p.n, p.n, 0.f),
        has_bias(with_bias) {
    args.lda = a.ld;
    args.ldb = b.ld;
    args.ldc = c.ld;
    a.randomize(seed * 4 + 0);
    b.randomize(seed * 4 + 1);
    bias.randomize(seed * 4 + 2);
    if (p.beta != 0) {
      c.randomize(seed * 4 + 3);
    } else {  // beta = 0 must not read c: NaN there would show
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = 0; j < p.n; ++j) c.set(i, j, NAN);
    }
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) c0.push_back(p.beta != 0 ? c.at(i, j) : 0.0);
  }

  void run() { cpu::matmul(args, a.data(), b.data(), c.data(), has_bias ? bias.data() : nullptr); }

  std::vector<double> reference() const {
    const auto& p = args;
    std::vector<double> ref(size_t(p.m * p.n));
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < p.k; ++q)
          s += double(p.trans_a ? a.at(q, i) : a.at(i, q)) * double(p.trans_b ? b.at(j, q) : b.at(q, j));
        double v = double(p.alpha) * s + double(p.beta) * c0[size_t(i * p.n + j)];
        if (has_bias) v += bias.at(0, j);
        ref[size_t(i * p.n + j)] = v;
      }
    return ref;
  }

  // Checks c against the reference with the tolerance of c's type (see the file header).
  void expect_matches(const std::vector<double>& ref, const std::string& what) const {
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    const double rel = args.c_type == DType::bf16 ? kBf16Round : 0.0;
    int bad = 0;
    for (int64_t i = 0; i < args.m && bad < 3; ++i)
      for (int64_t j = 0; j < args.n && bad < 3; ++j) {
        const double r = ref[size_t(i * args.n + j)], got = c.at(i, j);
        const double tol = rel * std::abs(r) + kF32Tol * scale;
        if (!(std::abs(got - r) <= tol)) {  // also catches NaN
          ADD_FAILURE() << what << ": c(" << i << "," << j << ") = " << got << ", reference " << r << ", tolerance "
                        << tol;
          ++bad;
        }
      }
  }
};

std::string name(DType t) { return dtype_name(t); }

std::string describe(const cpu::MatmulArgs& p, bool has_bias, int64_t pad) {
  return name(p.ab_type) + " -> " + name(p.c_type) + (has_bias ? ", bias " + name(p.bias_type) : ", no bias") +
         (p.trans_a ? ", a^T" : "") + (p.trans_b ? ", b^T" : "") + ", alpha " + std::to_string(p.alpha) + ", beta " +
         std::to_string(p.beta) + ", pad " + std::to_string(pad) + ", " + std::to_string(p.m) + "x" +
         std::to_string(p.n) + "x" + std::to_string(p.k);
}

// One test per (input type, output type, bias, shape); inside, every transpose, alpha, beta and padding.
struct Case {
  DType ab, c;
  int bias;  // 0 none, 1 f32, 2 bf16
  Shape shape;
  bool widened = false;  // bf16 inputs widened to f32 and multiplied by dnnl_sgemm (cpu::Bf16Gemm::widened)
};

void PrintTo(const Case& c, std::ostream* os) {
  const char* bias[] = {"none", "f32", "bf16"};
  *os << dtype_name(c.ab) << " -> " << dtype_name(c.c) << ", bias " << bias[c.bias] << ", " << c.shape.m << "x"
      << c.shape.n << "x" << c.shape.k << (c.widened ? ", widened" : "");
}

class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const Case tc = GetParam();
  // bf16 inputs need oneDNN's bf16 GEMMs, unless widened (any CPU).
  if (tc.ab == DType::bf16 && !tc.widened) RELAY_SKIP_WITHOUT_CPU_BF16();
  cpu::set_threads(2);
  cpu::set_bf16_gemm(tc.widened ? cpu::Bf16Gemm::widened : cpu::Bf16Gemm::native);
  struct Restore {
    ~Restore() { cpu::set_bf16_gemm(cpu::Bf16Gemm::native); }
  } restore;
  // The block-boundary shapes (millions of terms, ~0.3 s a combination) take every transpose with two of the
  // eight (alpha, beta, padding) settings, the plain one and the one with all three; the small shapes take all.
  const bool big = tc.shape.m * tc.shape.k > (1 << 20) || tc.shape.n * tc.shape.k > (1 << 20);
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float alpha : {1.f, 0.5f})
        for (float beta : {0.f, 1.f})
          for (int64_t pad : {0, 3}) {
            if (big && !(alpha == 1.f && beta == 0.f && pad == 0) && !(alpha != 1.f && beta != 0.f && pad != 0)) {
              ++seed;
              continue;
            }
            cpu::MatmulArgs p;
            p.trans_a = ta;
            p.trans_b = tb;
            p.m = tc.shape.m;
            p.n = tc.shape.n;
            p.k = tc.shape.k;
            p.ab_type = tc.ab;
            p.c_type = tc.c;
            p.bias_type = tc.bias == 2 ? DType::bf16 : DType::f32;
            p.alpha = alpha;
            p.beta = beta;
            Problem prob(p, tc.bias != 0, pad, seed++);
            const auto pad_before = prob.c.bits_at_padding();
            const auto ref = prob.reference();
            prob.run();
            const std::string what = describe(prob.args, prob.has_bias, pad);
            prob.expect_matches(ref, what);
            EXPECT_EQ(prob.c.bits_at_padding(), pad_before) << what << ": wrote c's padding columns";
          }
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (DType ab : {DType::f32, DType::bf16})
    for (DType c : {DType::f32, DType::bf16})
      for (int bias : {0, 1, 2})
        for (Shape s : {Shape{1, 1, 1}, Shape{3, 5, 7}, Shape{65, 33, 17}}) {
          out.push_back({ab, c, bias, s});
          if (ab == DType::bf16) out.push_back({ab, c, bias, s, true});
        }
  // Widened GEMMs run in blocks of 2048 rows, columns and summed terms: shapes across each boundary.
  for (DType c : {DType::f32, DType::bf16})
    for (Shape s : {Shape{2051, 5, 2049}, Shape{6, 2050, 9}}) out.push_back({DType::bf16, c, 1, s, true});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* bias[] = {"nobias", "biasf32", "biasbf16"};
  return name(c.ab) + "_to_" + name(c.c) + "_" + bias[c.bias] + "_" + std::to_string(c.shape.m) + "x" +
         std::to_string(c.shape.n) + "x" + std::to_string(c.shape.k) + (c.widened ? "_widened" : "");
}

INSTANTIATE_TEST_SUITE_P(Combinations, MatmulTest, ::testing::ValuesIn(all_cases()), case_name);

// m or n == 0 touches nothing; k == 0 is the empty sum: c = beta * c + bias.
TEST(Matmul, EmptyDimensions) {
  cpu::set_threads(2);
  cpu::MatmulArgs p;
  p.m = 4;
  p.n = 0;
  p.k = 5;
  p.lda = 5;
  p.ldb = 1;
  p.ldc = 1;
  std::vector<float> a(20, 1.f), b(5, 1.f), c(4, 42.f);
  cpu::matmul(p, a.data(), b.data(), c.data());
  EXPECT_EQ(c, std::vector<float>(4, 42.f)) << "n == 0 wrote c";
  // cpu::gemm (f32, dnnl_sgemm) with k == 0: c = beta c, as cpu::matmul and the CUDA backend give; beta 0 never reads c.
  for (float beta : {0.f, 0.5f}) {
    std::vector<float> g(6, beta == 0.f ? std::nanf("") : 4.f);
    cpu::gemm(false, false, 2, 3, 0, 3.f, a.data(), 1, b.data(), 3, beta, g.data(), 3);
    EXPECT_EQ(g, std::vector<float>(6, beta == 0.f ? 0.f : 2.f)) << "sgemm with k == 0, beta " << beta;
  }

  for (DType ct : {DType::f32, DType::bf16})
    for (float beta : {0.f, 1.f}) {
      cpu::MatmulArgs q;
      q.m = 3;
      q.n = 4;
      q.k = 0;
      q.lda = 1;
      q.ldb = 4;
      q.ldc = 4;
      q.c_type = ct;
      q.beta = beta;
      q.alpha = 3.f;  // multiplies an empty sum: no effect
      Problem prob(q, true, 0, 99);
      const auto ref = prob.reference();
      prob.run();
      prob.expect_matches(ref, describe(prob.args, true, 0) + " (k == 0)");
    }
}

// A cached primitive is tied to the call's signature, not to its pointers: new buffers with the
// same contents give bitwise the same c, new contents give the new product, and no primitive is added.
TEST(Matmul, CacheReusesPrimitiveAcrossPointers) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  cpu::set_threads(2);
  static int64_t run = 0;  // a shape of its own in every --gtest_repeat round
  cpu::MatmulArgs p;
  p.trans_b = true;
  p.m = 37 + run++;
  p.n = 29;
  p.k = 41;
  p.ab_type = DType::bf16;
  p.c_type = DType::f32;
  p.beta = 1.f;
  Problem first(p, true, 0, 5);
  const size_t before = cpu::matmul_cache_size();
  first.run();
  const size_t cached = cpu::matmul_cache_size();
  EXPECT_EQ(cached, before + 1) << "a new signature creates one primitive";

  Problem same(p, true, 0, 5);  // same values, other buffers
  ASSERT_NE(same.a.data(), first.a.data());
  same.run();
  EXPECT_EQ(cpu::matmul_cache_size(), cached) << "same signature created another primitive";
  ASSERT_EQ(same.c.f32.size(), first.c.f32.size());
  EXPECT_EQ(0, std::memcmp(same.c.f32.data(), first.c.f32.data(), first.c.f32.size() * sizeof(float)))
      << "same inputs at other addresses gave different bits";

  Problem other(p, true, 0, 6);  // other values: the result must follow the new pointers' contents
  const auto ref = other.reference();
  other.run();
  other.expect_matches(ref, "new contents through a cached primitive");
  EXPECT_EQ(cpu::matmul_cache_size(), cached);

  // A new thread count gets its own primitive (oneDNN fixes the work split at creation).
  cpu::set_threads(1);
  Problem one_thread(p, true, 0, 5);
  one_thread.run();
  EXPECT_EQ(cpu::matmul_cache_size(), cached + 1);
  cpu::set_threads(2);
}

// Threads that first meet one signature together build it once between them, and then run the one
// cached primitive at the same time, each with its own buffers (and its own scratchpad inside).
TEST(Matmul, ConcurrentCallsShareThePrimitive) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  cpu::set_threads(1);
  static int64_t run = 0;  // a shape of its own in every --gtest_repeat round
  const int64_t m = 40 + run++;
  const size_t before = cpu::matmul_cache_size();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, m] {
      omp_set_num_threads(1);  // a new thread starts from OpenMP's defaults, not the main thread's
      for (int rep = 0; rep < 5; ++rep) {
        cpu::MatmulArgs p;
        p.trans_a = true;
        p.m = m;
        p.n = 24;
        p.k = 56;
        p.ab_type = DType::bf16;
        p.c_type = DType::bf16;
        p.beta = 1.f;
        Problem prob(p, true, 0, uint64_t(1000 + 10 * t + rep));
        const auto ref = prob.reference();
        prob.run();
        prob.expect_matches(ref, "thread " + std::to_string(t) + " call " + std::to_string(rep));
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(cpu::matmul_cache_size(), before + 1) << "four threads, one signature: one primitive";
  cpu::set_threads(2);
}

// The GPT-2 shapes' primitives are oneDNN's fast kernels, not its reference loops.
TEST(Matmul, TightShapesUseOptimisedKernels) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  cpu::set_threads(2);
  for (DType t : {DType::f32, DType::bf16}) {
    cpu::MatmulArgs p;
    p.trans_b = true;
    p.m = 256;
    p.n = 2304;
    p.k = 768;
    p.lda = 768;
    p.ldb = 768;
    p.ldc = 2304;
    p.ab_type = t;
    p.c_type = t;
    const std::string impl = cpu::matmul_impl(p, true);
    EXPECT_EQ(impl.rfind("ref", 0), std::string::npos) << dtype_name(t) << " forward runs " << impl;
  }
}

// Without AVX512 oneDNN has no bf16 matmul: cpu::matmul must say so (naming the shape and the fix),
// while f32 still runs. oneDNN's ISA is capped to AVX2 in a fresh child process, before any primitive
// exists (the cap cannot be changed once oneDNN has looked at the CPU).
TEST(Matmul, Bf16WithoutCpuSupportIsAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto child = [] {
    if (dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2) != dnnl_success) std::exit(2);
    cpu::MatmulArgs p;
    p.m = 8;
    p.n = 16;
    p.k = 4;
    p.lda = 4;
    p.ldb = 16;
    p.ldc = 16;
    std::vector<float> a(32, 1.f), b(64, 0.5f), c(128, 0.f);
    cpu::matmul(p, a.data(), b.data(), c.data());
    if (c[0] != 2.f) std::exit(4);  // f32 keeps working on AVX2
    p.ab_type = DType::bf16;
    std::vector<bf16> ah(32, f32_to_bf16(1.f)), bh(64, f32_to_bf16(0.5f));
    try {
      cpu::matmul(p, ah.data(), bh.data(), c.data());
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(3);
    }
    std::exit(5);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(3),
              "matmul 8x16x4 .*inputs bfloat16.*lacks bf16 support.*train.precision = \"fp32\"");
}

// Backend::linear against matmul + add_bias + activation_forward on the CPU backend: the same bits in
// f32 (the same sgemm, bias pass and GELU kernel); in bf16 the fused bias is added before the GEMM's single
// rounding, so the pre-activation is within one bf16 ulp (2^-7 of max |ref|) and the GELU of it within two.
TEST(Linear, CpuEqualsUnfusedOps) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  bool has_bf16 = true;
  try {
    be->set_precision(Precision::bf16);
  } catch (const Error&) {
    has_bf16 = false;  // a CPU without AVX512: the f32 rows only
  }
  be->set_precision(Precision::fp32);
  struct Nio { int64_t n, in, out; };
  for (const DType dt : {DType::f32, DType::bf16}) {
    if (dt == DType::bf16 && !has_bf16) continue;
    for (const Nio g : {Nio{1, 1, 1}, Nio{5, 3, 7}, Nio{130, 96, 385}}) {
      for (const bool gelu : {false, true}) {
        for (const bool with_bias : {false, true}) {
          const std::string what = cat(dtype_name(dt), " ", g.n, "x", g.in, "x", g.out, gelu ? " gelu_tanh" : "",
                                       with_bias ? " bias" : " no bias");
          auto filled = [&](relay::Shape shape, uint64_t seed) {
            Tensor t(*be, shape, dt);
            Rng rng(seed, 0);
            std::vector<float> v(size_t(t.numel()));
            for (float& x : v) x = float(rng.uniform(-2.0, 2.0));
            be->upload_f32(t, v.data());
            return t;
          };
          Tensor x = filled({g.n, g.in}, 1), w = filled({g.out, g.in}, 2);
          Tensor bias = with_bias ? filled({g.out}, 3) : Tensor();
          Tensor y(*be, {g.n, g.out}, dt), pre(*be, {g.n, g.out}, dt);
          Tensor ref_y(*be, {g.n, g.out}, dt), ref_pre(*be, {g.n, g.out}, dt);
          be->linear(x, w, bias, y, gelu ? LinearAct::gelu_tanh : LinearAct::none, &pre);
          Tensor& ref_z = gelu ? ref_pre : ref_y;
          be->matmul(x, false, w, true, ref_z, 1.f, 0.f);
          if (with_bias) be->add_bias(ref_z, bias);
          if (gelu) be->activation_forward(Activation::gelu_tanh, ref_pre, ref_y);
          auto host = [&](const Tensor& t) {
            Tensor f(*be, t.shape());
            be->convert(t, f);
            std::vector<float> v(size_t(f.numel()));
            be->download(v.data(), f);
            return v;
          };
          const int pairs = gelu ? 2 : 1;
          for (int i = 0; i < pairs; ++i) {
            const std::vector<float> got = host(i == 0 ? y : pre), ref = host(i == 0 ? ref_y : ref_pre);
            double scale = 0.0, worst = 0.0;
            for (size_t j = 0; j < ref.size(); ++j) {
              scale = std::max(scale, std::fabs(double(ref[j])));
              worst = std::max(worst, std::fabs(double(got[j]) - double(ref[j])));
            }
            const double tol = dt == DType::f32 ? 0.0 : (i == 0 && gelu ? 0x1p-6 : 0x1p-7) * scale;
            EXPECT_LE(worst, tol) << what << (i == 0 ? ": y" : ": pre_act") << " max |fused - unfused| " << worst
                                  << ", max |unfused| " << scale;
          }
        }
      }
    }
  }
}

// Backend::grouped_matmul's reference: y's rows of group g = a's rows of g @ op(b[g]) (+ beta y), one matmul a group.
void matmul_a_group(Backend& be, const Tensor& a, const std::vector<Tensor>& b, bool tb, Tensor& y,
                    const std::vector<int64_t>& offsets, float beta) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    if (offsets[g + 1] > offsets[g]) {
      Tensor yg = y.rows(offsets[g], offsets[g + 1] - offsets[g]);  // (rows of g, n)
      be.matmul(a.rows(offsets[g], offsets[g + 1] - offsets[g]), false, b[g], tb, yg, 1.f, beta);
    }
}

// Backend::grouped_matmul and grouped_matmul_weight (a MoE layer's experts in one pass) against one matmul a group,
// in f32, on 2 threads: groups of 0, 37, 1, 0 and 20 rows of 64 (one group above a thread's share of the rows: the
// groups one after another, each GEMM threaded), and eight groups of 0 to 9 rows (the groups spread over the
// threads, each on one); the last 6 rows in none: left alone. Both transposes of b, beta 0 and 1; the weight
// gradients with beta 0.5, which an empty group's gradient is only scaled by. Within f32 rounding (oneDNN picks its
// kernel by the row count and the threads); rows in no group keep their bits.
class GroupedMatmul : public ::testing::TestWithParam<std::vector<int64_t>> {};
TEST_P(GroupedMatmul, CpuEqualsOneMatmulAGroup) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  const std::vector<int64_t> offsets = GetParam();
  const int64_t rows = 64, n = 24, k = 40, G = int64_t(offsets.size()) - 1;
  auto filled = [&](relay::Shape shape, uint64_t seed) {
    Tensor t(*be, shape);
    Rng rng(seed, 0);
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = float(rng.uniform(-2.0, 2.0));
    be->upload(t, v.data());
    return t;
  };
  auto host = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    be->download(v.data(), t);
    return v;
  };
  for (const bool tb : {true, false})
    for (const float beta : {0.f, 1.f}) {
      const std::string what = cat(tb ? "b transposed" : "b", ", beta ", beta);
      Tensor a = filled({rows, k}, 1), y = filled({rows, n}, 2), ref = filled({rows, n}, 2);  // (64, 40), (64, 24)
      std::vector<Tensor> b;
      for (int64_t g = 0; g < G; ++g) b.push_back(filled(tb ? relay::Shape{n, k} : relay::Shape{k, n}, 10 + g));
      be->grouped_matmul(a, b, tb, y, offsets, beta);
      matmul_a_group(*be, a, b, tb, ref, offsets, beta);
      const std::vector<float> got = host(y), want = host(ref);
      double scale = 0, worst = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        scale = std::max(scale, std::fabs(double(want[j])));
        worst = std::max(worst, std::fabs(double(got[j]) - double(want[j])));
      }
      EXPECT_LE(worst, kF32Tol * scale) << what;
      for (size_t j = size_t(offsets.back() * n); j < want.size(); ++j)
        ASSERT_EQ(got[j], want[j]) << what << ": row " << j / size_t(n) << " is in no group";
    }
  Tensor dy = filled({rows, n}, 3), x = filled({rows, k}, 4);  // (64, 24), (64, 40)
  std::vector<Tensor> dw, ref;
  for (int64_t g = 0; g < G; ++g) dw.push_back(filled({n, k}, 20 + g)), ref.push_back(filled({n, k}, 20 + g));
  be->grouped_matmul_weight(dy, x, offsets, dw, 0.5f);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = offsets[g + 1] - offsets[g];
    if (m > 0)
      be->matmul(dy.rows(offsets[g], m), true, x.rows(offsets[g], m), false, ref[size_t(g)], 1.f, 0.5f);
    else
      be->scale(ref[size_t(g)], 0.5f);
    const std::vector<float> got = host(dw[size_t(g)]), want = host(ref[size_t(g)]);
    double scale = 0, worst = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      scale = std::max(scale, std::fabs(double(want[j])));
      worst = std::max(worst, std::fabs(double(got[j]) - double(want[j])));
    }
    EXPECT_LE(worst, kF32Tol * scale) << "dw[" << g << "] of " << m << " rows";
  }
}
INSTANTIATE_TEST_SUITE_P(Groups, GroupedMatmul,
                         ::testing::Values(std::vector<int64_t>{0, 0, 37, 38, 38, 58},
                                           std::vector<int64_t>{0, 9, 9, 17, 25, 33, 41, 50, 58}),
                         [](const auto& info) { return info.index == 0 ? "skewed" : "spread"; });

// The bf16 grouped GEMMs run each group's rows in pieces of whole multiples of 64 (or of an eighth of the octave above
// 1024 rows) and the last < 64 rows padded to 64 with zero rows in scratch (cpu_backend.cpp, by_pieces): against one
// matmul a group, within one bf16 rounding of the output (a row's sums may be formed in another order, a weight
// gradient's pieces are summed in float and rounded once). Groups of 0, 5, 64, 100, 250 and 1500 rows (a padded
// piece alone, one whole piece, one of each, pieces at both granularities) spread over 2 threads, then the same rows
// in three groups, one after another with each GEMM threaded; beta 0 and 1; rows in no group keep their bits. Then
// 300 different row counts in [600, 900) add at most 7 primitives (multiples of 64 and the padded tail's shape).
TEST(GroupedMatmulBf16, PiecesEqualOneMatmulAGroup) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  try {
    be->set_precision(Precision::bf16);
  } catch (const Error&) {
    GTEST_SKIP() << "no bf16 matmul on this CPU";
  }
  if (cpu::bf16_gemm() != cpu::Bf16Gemm::native) GTEST_SKIP() << "bf16 GEMMs widened here: one piece a group";
  const int64_t rows = 1926, n = 48, k = 64;
  auto filled = [&](relay::Shape shape, uint64_t seed) {
    Tensor t(*be, shape, DType::bf16);
    Rng rng(seed, 0);
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = float(rng.uniform(-2.0, 2.0));
    be->upload_f32(t, v.data());
    return t;
  };
  auto host = [&](const Tensor& t) {  // a bf16 tensor's values
    std::vector<bf16> raw(size_t(t.numel()));
    be->download(raw.data(), t);
    std::vector<float> v(raw.size());
    for (size_t j = 0; j < raw.size(); ++j) v[j] = bf16_to_f32(raw[j]);
    return v;
  };
  // One bf16 rounding at the largest magnitude: 2^-8 of it.
  auto expect_close = [&](const Tensor& got_t, const Tensor& want_t, const std::string& what) {
    const std::vector<float> got = host(got_t), want = host(want_t);
    double scale = 0, worst = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      scale = std::max(scale, std::fabs(double(want[j])));
      worst = std::max(worst, std::fabs(double(got[j]) - double(want[j])));
    }
    EXPECT_LE(worst, scale / 256) << what;
    return got;
  };
  for (const std::vector<int64_t>& offsets :
       {std::vector<int64_t>{0, 0, 5, 69, 169, 419, 1919}, std::vector<int64_t>{0, 250, 1750, 1919}}) {
    const int64_t G = int64_t(offsets.size()) - 1;
    for (const bool tb : {true, false})
      for (const float beta : {0.f, 1.f}) {
        const std::string what = cat(G, " groups, ", tb ? "b transposed" : "b", ", beta ", beta);
        Tensor a = filled({rows, k}, 1), y = filled({rows, n}, 2), ref = filled({rows, n}, 2);  // (1926, 64), (1926, 48)
        std::vector<Tensor> b;
        for (int64_t g = 0; g < G; ++g) b.push_back(filled(tb ? relay::Shape{n, k} : relay::Shape{k, n}, 10 + g));
        be->grouped_matmul(a, b, tb, y, offsets, beta);
        matmul_a_group(*be, a, b, tb, ref, offsets, beta);
        const std::vector<float> got = expect_close(y, ref, what), want = host(ref);
        for (size_t j = size_t(offsets.back() * n); j < want.size(); ++j)
          ASSERT_EQ(got[j], want[j]) << what << ": row " << j / size_t(n) << " is in no group";
      }
    for (const float beta : {0.f, 1.f}) {
      Tensor dy = filled({rows, n}, 3), x = filled({rows, k}, 4);  // (1926, 48), (1926, 64)
      std::vector<Tensor> dw, ref;
      for (int64_t g = 0; g < G; ++g) dw.push_back(filled({n, k}, 20 + g)), ref.push_back(filled({n, k}, 20 + g));
      be->grouped_matmul_weight(dy, x, offsets, dw, beta);
      for (int64_t g = 0; g < G; ++g) {
        const int64_t m = offsets[g + 1] - offsets[g];
        if (m > 0) be->matmul(dy.rows(offsets[g], m), true, x.rows(offsets[g], m), false, ref[size_t(g)], 1.f, beta);
        else if (beta != 1.f) be->fill(ref[size_t(g)], 0.f);
        expect_close(dw[size_t(g)], ref[size_t(g)], cat("dw[", g, "] of ", m, " rows, ", G, " groups, beta ", beta));
      }
    }
  }
  Tensor a = filled({900, k}, 5), y(*be, {900, n}, DType::bf16), w = filled({n, k}, 6);
  std::vector<int64_t> counts;
  for (int64_t c = 600; c < 900; ++c) counts.push_back(c);
  be->grouped_matmul(a, {w}, true, y, {0, counts[0]}, 0.f);  // the padded tail's shape and a first whole one
  const size_t before = cpu::matmul_cache_size();
  for (int64_t c : counts) be->grouped_matmul(a, {w}, true, y, {0, c}, 0.f);
  EXPECT_LE(cpu::matmul_cache_size() - before, 7u) << "primitives made for 300 row counts in [600, 900)";
}

// Backend::linear_backward_input against matmul + activation_backward: the same ops on the CPU, so the
// same bits in f32 and bf16.
TEST(Linear, CpuBackwardInputEqualsUnfusedOps) {
  auto be = make_backend(BackendOptions{Device::cpu, 2});
  bool has_bf16 = true;
  try {
    be->set_precision(Precision::bf16);
  } catch (const Error&) {
    has_bf16 = false;
  }
  be->set_precision(Precision::fp32);
  for (const DType dt : {DType::f32, DType::bf16}) {
    if (dt == DType::bf16 && !has_bf16) continue;
    for (const bool gelu : {false, true}) {
      const int64_t n = 33, in = 40, out = 17;
      auto filled = [&](relay::Shape shape, uint64_t seed) {
        Tensor t(*be, shape, dt);
        Rng rng(seed, 0);
        std::vector<float> v(size_t(t.numel()));
        for (float& x : v) x = float(rng.uniform(-2.0, 2.0));
        be->upload_f32(t, v.data());
        return t;
      };
      Tensor dy = filled({n, out}, 4), w = filled({out, in}, 5), h = filled({n, in}, 6);
      Tensor dx(*be, {n, in}, dt), ref(*be, {n, in}, dt);
      be->linear_backward_input(dy, w, dx, gelu ? LinearAct::gelu_tanh : LinearAct::none, h);
      be->matmul(dy, false, w, false, ref, 1.f, 0.f);
      if (gelu) be->activation_backward(Activation::gelu_tanh, h, ref, ref);
      std::vector<std::byte> got(dx.bytes()), want(ref.bytes());
      be->download(got.data(), dx);
      be->download(want.data(), ref);
      EXPECT_TRUE(got == want) << dtype_name(dt) << (gelu ? " gelu_tanh" : " none") << ": not the same bits";
    }
  }
}

// A wrong shape is an internal error that names the op and the tensor, and ends the process.
TEST(Linear, FrontDoorNamesTheTensorAtFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto be = make_backend(BackendOptions{Device::cpu, 1});
  Tensor x(*be, {4, 3}), w(*be, {5, 3}), y(*be, {4, 5}), bias(*be, {6}), pre(*be, {4, 4});
  EXPECT_EXIT(be->linear(x, w, bias, y), ::testing::ExitedWithCode(1), "linear: bias .*has 6 elements, expected 5");
  EXPECT_EXIT(be->linear(x, w, Tensor(), y, LinearAct::gelu_tanh, &pre), ::testing::ExitedWithCode(1),
              "linear: pre_act .* vs y ");
}

// RELAY_OP_PROFILE=1 on the CPU: the backend prints, when destroyed, each outermost op's count and wall time since
// op_profile_restart (the ops before it are not counted; a matmul inside linear is linear's).
TEST(OpProfile, CpuPrintsTheOpsSinceRestart) {
  ::setenv("RELAY_OP_PROFILE", "1", 1);
  testing::internal::CaptureStderr();
  {
    auto be = make_backend(BackendOptions{Device::cpu, 2});
    Tensor a(*be, {8, 4}), w(*be, {6, 4}), y(*be, {8, 6});  // (8, 4), (6, 4), (8, 6)
    be->fill(a, 1.f);
    be->op_profile_restart();
    be->fill(w, 0.5f);
    for (int i = 0; i < 3; ++i) be->matmul(a, false, w, true, y, 1.f, 0.f);
    be->linear(a, w, Tensor(), y);
  }
  ::unsetenv("RELAY_OP_PROFILE");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("relay: CPU wall time by op (RELAY_OP_PROFILE) on cpu (oneDNN, 2 threads): 5 ops"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("% 3 x matmul\n"), std::string::npos) << err;
  EXPECT_NE(err.find("% 1 x fill\n"), std::string::npos) << err;
  EXPECT_NE(err.find("% 1 x linear\n"), std::string::npos) << err;
}

}  // namespace
}  // namespace relay
