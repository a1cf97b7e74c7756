// Every Backend op of the CUDA backend against the CPU reference backend (ggml's test-backend-ops):
// one table of (op, shape, dtype, precision) cases, each run from the same seeded inputs on both
// backends and compared output by output with the tolerance stated in its row; then a small MLP's
// forward, backward and SGD step composed from the same ops, in float32 and in bfloat16. Skipped where
// there is no CUDA device.
//
// bf16 rows: inputs are drawn in float, rounded to bfloat16 on the host and uploaded as bf16, and the
// CPU backend runs the same op on the same bf16 tensors: both sides start from identical bits, so a row
// measures the CUDA kernel, not the rounding of its inputs.
//
// Error measure: max |cuda - cpu| over an output, divided by max |cpu| over that output (errors
// relative to the output's scale, so GEMM sums that cancel to near zero do not inflate it). A bf16
// output is allowed one bf16 ulp more than its row's float tolerance (kBf16Ulp), except in exact rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "model/context_parallel.hpp"

namespace relay {
namespace {

#ifdef RELAY_HAVE_CUDA
constexpr const char* kNoCuda = "no CUDA device: cuda_device_count() == 0 (check CUDA_VISIBLE_DEVICES)";
#else
constexpr const char* kNoCuda = "no CUDA device: this build has no CUDA backend (RELAY_CUDA=OFF or no toolkit)";
#endif

// Tolerances, relative to each output's largest reference magnitude.
constexpr double kTolExact = 0.0;       // copies, fills, conversions, argmax indices: bit for bit, bf16 too
constexpr double kTolFp32 = 1e-5;       // float math in another order (fp32 GEMMs without TF32, reductions,
                                        // expf/erff against the CPU's polynomials, ~5e-7)
constexpr double kTolTf32 = 5e-3;       // TF32 GEMM inputs keep 10 of float's 23 mantissa bits (relative
                                        // error up to 2^-10 each, truncated or rounded): ~1e-3 per product,
                                        // sums of up to 1023 products against the CPU's fp32
constexpr double kTolBf16Gemm = 2e-4;   // bf16 a, b: the products are exact in float; float accumulation of
                                        // up to 1023 of them in another order (tensor cores align the
                                        // addends to the largest before adding)
constexpr double kBf16Ulp = 0x1p-7;     // added for a bf16 output: float results that differ in their last
                                        // bits can round to neighbouring bf16 values, one ulp apart, and
                                        // one bf16 ulp is at most 2^-7 of the value (8 significant bits)
constexpr double kTolFp8Gemm = 5e-5;   // FP8 GEMMs: exact products, float sums of up to 260 terms in another
                                        // order (the CPU's sgemm blocks, the GPU's one thread per output)
constexpr double kTolFp8Lt = 5e-3;     // FP8 GEMMs on cuBLASLt's tensor cores: exact products, but Hopper's FP8 MMA
                                        // accumulates a k interval keeping ~14 bits (DeepSeek-V3, arXiv:2412.19437
                                        // section 3.3.2) before cuBLASLt promotes it to fp32: up to ~2^-14 per add
                                        // of a running sum, ~128 adds per interval, truncation biased one way. A scale
                                        // read from the wrong tile is off by a power of two (fp8_tiled_input): O(1)
constexpr double kTolSumSq = 1e-9;      // both backends square and sum in double
constexpr double kTolMlp = 1e-4;        // a chain of ~15 fp32 ops
constexpr double kTolMlpBf16 = 5e-2;    // the same chain on bf16 activations and working weights on both
                                        // backends: one rounding flip early in the chain moves the bf16
                                        // values that depend on it by an ulp (2^-8 relative) or more
constexpr double kTolAttention = 2e-5;  // fp32 dot products and softmax sums of up to T terms, in
                                        // another order (and expf) than the CPU's
constexpr double kTolFlash = 5e-5;      // flash against flash: other tile shapes (CPU 128, GPU 16/8/32), so
                                        // the online softmax rescales in another order; exp2f against the
                                        // CPU's polynomial (1e-7); dK, dV, dQ sum up to T = 257 terms

struct Output {
  std::string name;
  std::vector<double> values;
  bool bf16 = false;  // downloaded from a bf16 tensor (its row's tolerance gets one bf16 ulp more)
  bool exact = false;  // compared bit for bit whatever its row's tolerance (a router's chosen experts)
};

struct OpCase {
  std::string name;  // also the test's name: [A-Za-z0-9_]
  // Both backends' train.precision: it chooses the GEMM mode only (bf16 GEMM rows check that the device
  // has bf16 GEMMs; the CPU computes a tf32 row in fp32, TF32 being a CUDA mode). The other bf16 rows
  // run under fp32: a kernel's dtype comes from its tensors.
  Precision precision;
  double tolerance;
  std::function<std::vector<Output>(Backend&)> run;  // makes its inputs from fixed seeds
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

Backend& cpu_backend() {
  static std::unique_ptr<Backend> be = make_backend(BackendOptions{Device::cpu, 1});
  return *be;
}

Backend& cuda_backend() {
  static std::unique_ptr<Backend> be = make_backend(BackendOptions{Device::cuda, 1});
  return *be;
}

// --- inputs and outputs ------------------------------------------------------------------------

std::vector<float> random_values(int64_t n, uint64_t seed, double lo, double hi) {
  Rng rng(seed, 0);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

// Set while Bf16Ops runs a pair: float inputs are rounded to bf16 values too, so that the bf16 row and its
// fp32 twin read the same numbers and differ only by the op's bf16 storage.
bool g_bf16_representable_inputs = false;

// v rounded to t's dtype on the host (f32_to_bf16: round to nearest even), then uploaded.
void upload_values(Backend& be, Tensor& t, const std::vector<float>& v) {
  if (t.dtype() == DType::f32 && g_bf16_representable_inputs) {
    std::vector<float> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(v[i]);
    be.upload(t, r.data());
  } else if (t.dtype() == DType::bf16) {
    std::vector<bf16> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    be.upload(t, b.data());
  } else {
    be.upload(t, v.data());
  }
}

Tensor input(Backend& be, const Shape& shape, uint64_t seed, DType dt, double lo = -1.0, double hi = 1.0) {
  Tensor t(be, shape, dt);
  upload_values(be, t, random_values(t.numel(), seed, lo, hi));
  return t;
}
Tensor input(Backend& be, const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return input(be, shape, seed, DType::f32, lo, hi);
}

// An FP8 GEMM operand before quantisation, (rows, cols) f32: uniform in [-1, 1] times 2^e, e in [-3, 3] varying with
// the row, the column and the 128-row and 128-column blocks, so that neighbouring 1 x 128, 128 x 1 and 128 x 128 tiles
// have scales a power of two apart and a scale read from the wrong tile (a layout mistake) is an O(1) error.
Tensor fp8_tiled_input(Backend& be, int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v = random_values(rows * cols, seed, -1.0, 1.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(r * cols + c)] *= std::ldexp(1.f, int((r % 5 + c % 3 + 2 * (c / 128) + 3 * (r / 128)) % 7) - 3);
  Tensor t(be, {rows, cols});
  upload_values(be, t, v);
  return t;
}

// Values from {0, 1, 2, 3}: many ties, to check that the first maximum wins.
Tensor input_with_ties(Backend& be, const Shape& shape, uint64_t seed, DType dt = DType::f32) {
  Tensor t(be, shape, dt);
  std::vector<float> v = random_values(t.numel(), seed, 0.0, 4.0);
  for (float& x : v) x = std::floor(x);
  upload_values(be, t, v);
  return t;
}

// ignore_every > 0: every ignore_every-th target (from the first) is -1, an ignored position.
Tensor class_targets(Backend& be, int64_t n, int64_t classes, uint64_t seed, int64_t ignore_every = 0) {
  Tensor t(be, {n}, DType::i32);
  Rng rng(seed, 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(classes)));
  if (ignore_every > 0)
    for (size_t i = 0; i < v.size(); i += static_cast<size_t>(ignore_every)) v[i] = -1;
  be.upload(t, v.data());
  return t;
}

// data.document_mask's layout for B sequences of T rows: documents of 1 to 2T/3 rows (seeded), as model/documents.cpp
// derives it: doc_start (B*T) each row's document start, positions (B*T) the row's position in its document.
void document_layout_rows(int64_t B, int64_t T, uint64_t seed, std::vector<int32_t>& doc_start,
                          std::vector<int32_t>& positions) {
  Rng rng(seed, 2);
  doc_start.assign(static_cast<size_t>(B * T), 0);
  positions.assign(doc_start.size(), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, end = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t == end) {  // a new document
        start = t;
        end = t + 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(std::max<int64_t>(1, 2 * T / 3))));
      }
      doc_start[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(start);
      positions[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t - start);
    }
  }
}
Tensor i32_tensor(Backend& be, const std::vector<int32_t>& v) {
  Tensor t(be, {static_cast<int64_t>(v.size())}, DType::i32);
  be.upload(t, v.data());
  return t;
}

// The same bits as t (a tensor of the CPU backend) in a tensor of be.
Tensor copy_to(Backend& be, const Tensor& t) {
  std::vector<std::byte> host(t.bytes());
  cpu_backend().download(host.data(), t);
  Tensor r(be, t.shape(), t.dtype());
  be.upload(r, host.data());
  return r;
}

Output out(Backend& be, const std::string& name, const Tensor& t) {
  Output o{name, std::vector<double>(static_cast<size_t>(t.numel())), t.dtype() == DType::bf16};
  if (t.dtype() == DType::i32) {
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = v[i];
  } else if (t.dtype() == DType::fp8_e4m3 || t.dtype() == DType::fp8_e5m2) {
    std::vector<uint8_t> v(static_cast<size_t>(t.numel()));  // the codes, compared as integers
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = v[i];
    o.exact = true;
  } else if (t.dtype() == DType::bf16) {
    std::vector<bf16> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = bf16_to_f32(v[i]);
  } else {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    for (size_t i = 0; i < v.size(); ++i) o.values[i] = v[i];
  }
  return o;
}

std::string dims(const Shape& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += 'x';
    r += std::to_string(s[i]);
  }
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

// Row name suffix of a storage dtype: float32 rows keep their historical names.
std::string suffix(DType x) { return x == DType::bf16 ? "_bf16" : ""; }

// --- mixture-of-experts inputs ------------------------------------------------------------------
// The routing rows compare the experts chosen bit for bit, so their logits have no near-ties: the CPU's and the GPU's
// probabilities differ in their last bits (expf, sums in another order), and a choice between two scores that agree
// to rounding is neither backend's mistake. RouterInputsHaveNoNearTies checks the margin of every row's inputs.

const std::vector<int64_t> kMoeTokens = {1, 7, 64, 300};  // n: each routing row runs all four
constexpr uint64_t kRouterSeed = 170;                     // logits of n tokens: seed kRouterSeed + n
constexpr uint64_t kBiasSeed = 171;
struct MoeShape { int64_t E, k; };
std::vector<MoeShape> moe_shapes() {  // E experts, top k <= E
  std::vector<MoeShape> r;
  for (int64_t E : {2, 4, 8, 60, 128})
    for (int64_t k : {1, 2, 8})
      if (k <= E) r.push_back({E, k});
  return r;
}

// (n, E) router logits: row t a shuffle of the E distinct values (i - E/2 + o_t) * step, i < E, with a row offset
// o_t in [-32, 32] and step 1/4 (E <= 32) or 1/16: integers below 2^7 times a power of two, exact in bf16, and
// neighbouring probabilities a factor exp(step) >= 1.06 apart.
std::vector<float> router_logits(int64_t n, int64_t E) {
  Rng rng(kRouterSeed + static_cast<uint64_t>(n), 3);
  const float step = E <= 32 ? 0.25f : 0.0625f;
  std::vector<float> v(static_cast<size_t>(n * E));
  std::vector<int64_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < E; ++i) perm[size_t(i)] = i;
    for (int64_t i = E - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[rng.below(static_cast<uint64_t>(i + 1))]);
    const int64_t o = static_cast<int64_t>(rng.below(65)) - 32;
    for (int64_t e = 0; e < E; ++e) v[size_t(t * E + e)] = static_cast<float>(perm[size_t(e)] - E / 2 + o) * step;
  }
  return v;
}
// (E) expert bias of 0 or 1 (aux-loss-free balancing): a choice both by bias and, among equal biases, by probability;
// a probability is below 1, so scores of different biases are never near each other unless one probability is near 1.
std::vector<float> router_bias(int64_t E) {
  Rng rng(kBiasSeed, 3);
  std::vector<float> v(static_cast<size_t>(E));
  for (float& b : v) b = static_cast<float>(rng.below(2));
  return v;
}
// The smallest gap, over the rows, between neighbouring scores among each row's k + 1 best (in double): the margin
// by which the top k and their order are decided.
double router_margin(const std::vector<float>& logits, int64_t n, int64_t E, int64_t k, const std::vector<float>& bias) {
  double margin = INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    const float* z = logits.data() + t * E;
    const double mx = *std::max_element(z, z + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(z[e]) - mx);
    std::vector<double> s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = std::exp(double(z[e]) - mx) / sum + (bias.empty() ? 0.0 : bias[size_t(e)]);
    std::sort(s.begin(), s.end(), std::greater<double>());
    for (int64_t j = 0; j < std::min(k, E - 1); ++j) margin = std::min(margin, s[size_t(j)] - s[size_t(j + 1)]);
  }
  return margin;
}
// DeepSeek-V3's group-limited router (moe_group_router_*): (E, n_group, topk_group, k).
struct GroupShape { int64_t E, n_group, topk_group, k; };
std::vector<GroupShape> group_shapes() {
  return {{8, 2, 1, 2}, {16, 4, 2, 3}, {12, 4, 4, 4}, {64, 1, 1, 6}, {256, 8, 4, 8}, {6, 6, 2, 2}};
}
// The router rows' values: expert e's correction bias is kGroupBias[e % 3], and its logits are drawn from that bias's
// own few values (kGroupLogits[e % 3]), so that a row holds exact ties (equal logits of experts with equal biases:
// the same scores on both backends) but no near ties: every two different choice scores p + bias, and every two
// different sums of two of them (a group's score), differ by far more than float rounding
// (BackendOpsMoe.GroupRouterInputsHaveNoNearTies checks it). Every value is exact in bf16.
constexpr float kGroupBias[3] = {0.0f, 0.375f, -0.25f};
const std::vector<float> kGroupLogits[3] = {{-2.0f, 0.5f, 2.5f}, {-1.0f, 1.25f}, {-1.5f, 1.75f}};
std::vector<float> group_router_logits(int64_t n, int64_t E) {
  Rng rng(kRouterSeed + 7 + static_cast<uint64_t>(n), 3);
  std::vector<float> v(static_cast<size_t>(n * E));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<float>& values = kGroupLogits[e % 3];
      v[size_t(t * E + e)] = values[rng.below(values.size())];
    }
  return v;
}
std::vector<float> group_router_bias(int64_t E) {
  std::vector<float> v(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) v[size_t(e)] = kGroupBias[e % 3];
  return v;
}
// pos (n, k): a random permutation of the n k expert rows, as the MoE layer's regrouping makes.
Tensor row_permutation(Backend& be, int64_t n, int64_t k, uint64_t seed) {
  std::vector<int32_t> v;
  for (int64_t r : permutation(n * k, seed, 4)) v.push_back(static_cast<int32_t>(r));
  return i32_tensor(be, v).view({n, k});
}

// --- the table ---------------------------------------------------------------------------------

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  const std::vector<Shape> shapes = {{1, 1}, {3, 7}, {127, 513}, {256, 1024}};
  const std::vector<DType> float_types = {DType::f32, DType::bf16};
  auto add = [&](std::string name, double tol, std::function<std::vector<Output>(Backend&)> run,
                 Precision p = Precision::fp32) { cases.push_back({std::move(name), p, tol, std::move(run)}); };

  // memory: upload/download, pinned host buffers, copies (also of row views), fill
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (const Shape& s : shapes) {
      const std::string d = dims(s);
      add("upload_download_" + d + sx, kTolExact,
          [=](Backend& be) { return std::vector{out(be, "x", input(be, s, 1, x))}; });
      add("upload_pinned_" + d + sx, kTolExact, [=](Backend& be) {
        Tensor t(be, s, x), staged = input(cpu_backend(), s, 2, x);  // staged: the bytes to upload
        std::shared_ptr<std::byte> host = be.allocate_host(t.bytes());
        cpu_backend().download(host.get(), staged);
        be.upload(t, host.get());
        return std::vector{out(be, "x", t)};
      });
      add("copy_" + d + sx, kTolExact, [=](Backend& be) {
        Tensor src = input(be, s, 3, x), dst(be, s, x);
        be.copy(dst, src);
        return std::vector{out(be, "dst", dst)};
      });
      // 0.3 is not a bf16 value: both backends round it to nearest even
      add("fill_" + d + sx, kTolExact, [=](Backend& be) {
        Tensor t = input(be, s, 4, x);
        be.fill(t, x == DType::bf16 ? 0.3f : 0.375f);
        return std::vector{out(be, "x", t)};
      });
    }
    // dst (37, w) row i = src (50, w) row index[i], repeats and any order (data.preload's micro-batches, context
    // parallelism's keys): widths of 16-byte words (64) and not (7).
    for (int64_t w : {7, 64})
      add("gather_rows_37_of_50x" + std::to_string(w) + sx, kTolExact, [=](Backend& be) {
        std::vector<int32_t> index(37);
        for (size_t i = 0; i < index.size(); ++i) index[i] = int32_t((i * 29 + 11) % 50);
        Tensor src = input(be, {50, w}, 7, x), dst(be, {37, w}, x), idx = i32_tensor(be, index);
        be.gather_rows(src, idx, dst);
        return std::vector{out(be, "dst", dst)};
      });
    add("copy_row_view_9x5" + sx, kTolExact, [=](Backend& be) {
      Tensor src = input(be, {9, 5}, 5, x), dst = input(be, {9, 5}, 6, x);
      Tensor dst_rows = dst.rows(2, 4);
      be.copy(dst_rows, src.rows(5, 4));
      return std::vector{out(be, "dst", dst), out(be, "dst_rows", dst_rows)};
    });
  }
  // Uploads of 4 MiB and more land in a device buffer on a copy stream (CUDA): three in a row through the two staging
  // slots, the third overwriting the first tensor, must leave each tensor with its own bytes; upload_f32 into bf16
  // rounds on the GPU there (to nearest even, as the host does), small and large, special values included.
  for (DType x : float_types)
    add("upload_landed_1100x1024" + suffix(x), kTolExact, [=](Backend& be) {
      const Shape s = {1100, 1024};
      Tensor a(be, s, x), b(be, s, x), c = input(be, s, 1, x), d = input(be, s, 2, x), e = input(be, s, 3, x);
      std::vector<std::byte> host(static_cast<size_t>(a.bytes()));
      for (auto [src, dst] : {std::pair{&c, &a}, {&d, &b}, {&e, &a}}) {
        be.download(host.data(), *src);
        be.upload(*dst, host.data());
        std::fill(host.begin(), host.end(), std::byte{0x7f});  // the caller may reuse its buffer at once
      }
      return std::vector{out(be, "a", a), out(be, "b", b)};
    });
  for (const Shape& s : std::vector<Shape>{{3, 7}, {1100, 1024}})
    add("upload_f32_to_bf16_" + dims(s), kTolExact, [=](Backend& be) {
      std::vector<float> v = random_values(s[0] * s[1], 11, -300, 300);
      const std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0x7f800000u, 0x00000001u};
      for (size_t i = 0; i < bits.size() && i < v.size(); ++i) std::memcpy(&v[i], &bits[i], sizeof(float));
      Tensor t(be, s, DType::bf16), u(be, s, DType::bf16);
      be.upload_f32(t, v.data());
      for (float& f : v) f = -f;
      be.upload_f32(u, v.data());
      return std::vector{out(be, "t", t), out(be, "u", u)};
    });
  add("fill_i32_5x3", kTolExact, [](Backend& be) {
    Tensor t = class_targets(be, 15, 100, 7).view({5, 3});
    be.fill(t, -7.0f);
    return std::vector{out(be, "x", t)};
  });

  // convert: float32 -> bfloat16 rounds to nearest even on both backends, bfloat16 -> float32 is exact
  for (const Shape& s : shapes) {
    const std::string d = dims(s);
    add("convert_f32_to_bf16_" + d, kTolExact, [s](Backend& be) {
      Tensor src = input(be, s, 8, -300, 300), dst(be, s, DType::bf16);
      be.convert(src, dst);
      return std::vector{out(be, "dst", dst)};
    });
    add("convert_bf16_to_f32_" + d, kTolExact, [s](Backend& be) {
      Tensor src = input(be, s, 9, DType::bf16, -300, 300), dst(be, s);
      be.convert(src, dst);
      return std::vector{out(be, "dst", dst)};
    });
  }
  // Halfway cases (ties to even), the largest float (rounds to infinity), infinities, NaN, a subnormal,
  // negative zero.
  add("convert_f32_to_bf16_special_values", kTolExact, [](Backend& be) {
    const std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u, 0x7f7fffffu,
                                        0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0x007fffffu,
                                        0x80000000u, 0x3f800000u};
    std::vector<float> v(bits.size());
    std::memcpy(v.data(), bits.data(), bits.size() * sizeof(float));
    Tensor src(be, {static_cast<int64_t>(v.size())}), dst(be, {static_cast<int64_t>(v.size())}, DType::bf16);
    be.upload(src, v.data());
    be.convert(src, dst);
    return std::vector{out(be, "dst", dst)};
  });

  // matmul: y (m, n) = alpha op(a) op(b) + beta y, every transpose combination; float32 (also on TF32
  // tensor cores) and bfloat16 a, b with a float32 or a bfloat16 y. 1025 x 1027 x 1029: large enough (m n k >= 2^30)
  // that CUDA runs it on zero-padded copies (every extent odd: m padded where a is stored transposed).
  struct Mnk { int64_t m, n, k; };
  const std::vector<Mnk> gemms = {{1, 1, 1}, {3, 7, 5}, {127, 513, 65}, {256, 1024, 512}, {33, 17, 1023},
                                  {1025, 1027, 1029}};
  for (const Mnk& g : gemms) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const std::string base = "matmul_" + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                               "_" + (ta ? "t" : "n") + (tb ? "t" : "n");
      auto run = [g, ta, tb](DType ab, DType yt, float alpha, float beta) {
        return [=](Backend& be) {
          Tensor a = input(be, ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, 10, ab);
          Tensor b = input(be, tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, 11, ab);
          Tensor y = input(be, {g.m, g.n}, 12, yt);
          be.matmul(a, ta, b, tb, y, alpha, beta);
          return std::vector{out(be, "y", y)};
        };
      };
      add(base + "_fp32", kTolFp32, run(DType::f32, DType::f32, 1.0f, 0.0f));
      add(base + "_tf32", kTolTf32, run(DType::f32, DType::f32, 1.0f, 0.0f), Precision::tf32);
      add(base + "_bf16", kTolBf16Gemm, run(DType::bf16, DType::bf16, 1.0f, 0.0f), Precision::bf16);
      add(base + "_bf16_y_f32", kTolBf16Gemm, run(DType::bf16, DType::f32, 1.0f, 0.0f), Precision::bf16);
      if (t == 0) {
        add(base + "_alpha_beta_fp32", kTolFp32, run(DType::f32, DType::f32, 0.5f, 2.0f));
        add(base + "_alpha_beta_bf16", kTolBf16Gemm, run(DType::bf16, DType::bf16, 0.5f, 2.0f), Precision::bf16);
        add(base + "_alpha_beta_bf16_y_f32", kTolBf16Gemm, run(DType::bf16, DType::f32, 0.5f, 2.0f), Precision::bf16);
      }
    }
  }

  // Grouped GEMMs (a MoE layer's experts in one pass; cublasGemmGroupedBatchedEx on CUDA): 5 row groups of 3, 0, 17,
  // 1 and 19 rows of 45 (the last 5 rows belong to none and are left alone; the empty group is skipped, or scaled
  // by beta in the weight gradient), y = a op(b[g]) + beta y per group with b transposed (the forward) or not (the
  // input gradient), and dw[g] = dy_g^T x_g + beta dw[g]; float32 (also TF32), bfloat16, and bfloat16 inputs into
  // float32 weight gradients (one GEMM a group on CUDA).
  {
    const std::vector<int64_t> offsets = {0, 3, 3, 20, 21, 40};
    const int64_t rows = 45, G = int64_t(offsets.size()) - 1;
    for (const Mnk& g : std::vector<Mnk>{{0, 7, 5}, {0, 96, 64}}) {  // n, k (m: the groups)
      const std::string d = std::to_string(g.n) + "x" + std::to_string(g.k);
      for (const bool tb : {true, false})
        for (const float beta : {0.0f, 1.0f}) {
          auto run = [=](DType x) {
            return [=](Backend& be) {
              Tensor a = input(be, {rows, g.k}, 20, x), y = input(be, {rows, g.n}, 21, x);  // (45, k), (45, n)
              std::vector<Tensor> b;
              for (int64_t e = 0; e < G; ++e) b.push_back(input(be, tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, 22 + e, x));
              be.grouped_matmul(a, b, tb, y, offsets, beta);
              return std::vector{out(be, "y", y)};
            };
          };
          const std::string base = "grouped_matmul_" + d + (tb ? "_nt" : "_nn") + (beta != 0 ? "_beta1" : "");
          add(base + "_fp32", kTolFp32, run(DType::f32));
          add(base + "_tf32", kTolTf32, run(DType::f32), Precision::tf32);
          add(base + "_bf16", kTolBf16Gemm, run(DType::bf16), Precision::bf16);
        }
      for (const float beta : {0.5f, 1.0f}) {
        auto run = [=](DType x, DType w) {
          return [=](Backend& be) {
            Tensor dy = input(be, {rows, g.n}, 30, x), xs = input(be, {rows, g.k}, 31, x);  // (45, n), (45, k)
            std::vector<Tensor> dw;
            for (int64_t e = 0; e < G; ++e) dw.push_back(input(be, {g.n, g.k}, 32 + e, w));
            be.grouped_matmul_weight(dy, xs, offsets, dw, beta);
            std::vector<Output> o;
            for (int64_t e = 0; e < G; ++e) o.push_back(out(be, "dw" + std::to_string(e), dw[size_t(e)]));
            return o;
          };
        };
        const std::string base = "grouped_matmul_weight_" + d + (beta != 1 ? "_beta_half" : "");
        add(base + "_fp32", kTolFp32, run(DType::f32, DType::f32));
        add(base + "_bf16", kTolBf16Gemm, run(DType::bf16, DType::bf16), Precision::bf16);
        add(base + "_bf16_dw_f32", kTolBf16Gemm, run(DType::bf16, DType::f32), Precision::bf16);
      }
    }
  }

  // linear: y (n, out) = act(x (n, in) @ w (out, in)^T + bias), pre_act = the GELU's input; with and
  // without bias, no activation or gelu_tanh. On CUDA, cuBLASLt's BIAS / GELU_AUX_BIAS epilogues where out is
  // a multiple of 8 (its rule for the pre-activation's leading dimension), the unfused path at out = 513.
  struct Nio { int64_t n, in, out; };
  for (const Nio& g : std::vector<Nio>{{1, 1, 1}, {3, 5, 7}, {64, 96, 256}, {127, 65, 513}}) {
    for (const bool gelu : {false, true}) {
      for (const bool with_bias : {false, true}) {
        const std::string base = std::string("linear") + (gelu ? "_gelu_tanh_" : "_") + std::to_string(g.n) + "x" +
                                 std::to_string(g.in) + "x" + std::to_string(g.out) + (with_bias ? "_bias" : "_nobias");
        auto run = [=](DType x) {
          return [=](Backend& be) {
            Tensor in = input(be, {g.n, g.in}, 14, x), w = input(be, {g.out, g.in}, 15, x);
            Tensor bias = with_bias ? input(be, {g.out}, 16, x) : Tensor();
            Tensor y(be, {g.n, g.out}, x), pre(be, {g.n, g.out}, x);
            be.linear(in, w, bias, y, gelu ? LinearAct::gelu_tanh : LinearAct::none, &pre);
            std::vector<Output> o{out(be, "y", y)};
            if (gelu) o.push_back(out(be, "pre_act", pre));
            return o;
          };
        };
        add(base, kTolFp32, run(DType::f32));
        add(base + "_bf16", kTolBf16Gemm, run(DType::bf16), Precision::bf16);
        if (gelu && with_bias && g.n == 64) add(base + "_tf32", kTolTf32, run(DType::f32), Precision::tf32);
      }
      // Its input gradient through the preceding GELU: dx (n, in) = gelu_tanh'(h) * (dy (n, out) @ w (out, in));
      // on CUDA the DGELU epilogue where in is a multiple of 8.
      const std::string base = std::string("linear_backward_input") + (gelu ? "_gelu_tanh_" : "_") +
                               std::to_string(g.n) + "x" + std::to_string(g.in) + "x" + std::to_string(g.out);
      auto run = [=](DType x) {
        return [=](Backend& be) {
          Tensor dy = input(be, {g.n, g.out}, 17, x), w = input(be, {g.out, g.in}, 18, x);
          Tensor h = input(be, {g.n, g.in}, 19, x, -3.0, 3.0), dx(be, {g.n, g.in}, x);
          be.linear_backward_input(dy, w, dx, gelu ? LinearAct::gelu_tanh : LinearAct::none, h);
          return std::vector{out(be, "dx", dx)};
        };
      };
      add(base, kTolFp32, run(DType::f32));
      add(base + "_bf16", kTolBf16Gemm, run(DType::bf16), Precision::bf16);
    }
  }

  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (const Shape& s : shapes) {
      const std::string d = dims(s);
      const int64_t n = s[0], f = s[1];

      // bias (db is float32 whatever dy is)
      add("add_bias_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor y = input(be, s, 20, x), bias = input(be, {f}, 21, x);
        be.add_bias(y, bias);
        return std::vector{out(be, "y", y)};
      });
      for (float beta : {0.0f, 1.0f}) {
        add("bias_grad_" + d + (beta == 0.0f ? "_beta0" : "_beta1") + sx, kTolFp32, [=](Backend& be) {
          Tensor dy = input(be, s, 22, x), db = input(be, {f}, 23);
          be.bias_grad(dy, db, beta);
          return std::vector{out(be, "db", db)};
        });
      }

      // activations; the backward also in place (dx aliasing dy)
      for (Activation act : {Activation::relu, Activation::gelu, Activation::tanh, Activation::gelu_tanh}) {
        const std::string a = act_name(act);
        add(a + "_forward_" + d + sx, kTolFp32, [=](Backend& be) {
          Tensor xin = input(be, s, 30, x, -4, 4), y(be, s, x);
          be.activation_forward(act, xin, y);
          return std::vector{out(be, "y", y)};
        });
        add(a + "_backward_" + d + sx, kTolFp32, [=](Backend& be) {
          Tensor xin = input(be, s, 31, x, -4, 4), dy = input(be, s, 32, x), dx(be, s, x);
          be.activation_backward(act, xin, dy, dx);
          return std::vector{out(be, "dx", dx)};
        });
        add(a + "_backward_inplace_" + d + sx, kTolFp32, [=](Backend& be) {
          Tensor xin = input(be, s, 33, x, -4, 4), g = input(be, s, 34, x);
          be.activation_backward(act, xin, g, g);
          return std::vector{out(be, "dx", g)};
        });
      }

      add("scale_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor t = input(be, s, 40, x);
        be.scale(t, -0.3f);
        return std::vector{out(be, "x", t)};
      });

      // layernorm over the last dimension (inputs off-centre, so the mean matters); mean, rstd, dgamma
      // and dbeta are float32 whatever x is
      add("layernorm_forward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, s, 50, x, 1, 5), gamma = input(be, {f}, 51, x, 0.5, 1.5), beta = input(be, {f}, 52, x);
        Tensor y(be, s, x), mean(be, {n}), rstd(be, {n});
        be.layernorm_forward(xin, gamma, beta, 1e-5f, y, mean, rstd);
        return std::vector{out(be, "y", y), out(be, "mean", mean), out(be, "rstd", rstd)};
      });
      add("layernorm_backward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, s, 53, x, 1, 5), gamma = input(be, {f}, 54, x, 0.5, 1.5), beta = input(be, {f}, 55, x);
        Tensor y(be, s, x), mean(be, {n}), rstd(be, {n}), dx(be, s, x);
        be.layernorm_forward(xin, gamma, beta, 1e-5f, y, mean, rstd);
        Tensor dy = input(be, s, 56, x);
        Tensor dgamma = input(be, {f}, 57), dbeta = input(be, {f}, 58);  // accumulated into
        be.layernorm_backward_input(dy, xin, gamma, mean, rstd, dx);
        be.layernorm_backward_weight(dy, xin, mean, rstd, dgamma, dbeta);
        return std::vector{out(be, "dx", dx), out(be, "dgamma", dgamma), out(be, "dbeta", dbeta)};
      });

      // losses: (n, classes) = s; losses, row maxima and partial sums are float32
      for (bool with_grad : {false, true}) {
        const std::string g = with_grad ? "" : "_no_grad";
        add("cross_entropy_" + d + g + sx, kTolFp32, [=](Backend& be) {
          Tensor logits = input(be, s, 60, x, -6, 6), targets = class_targets(be, n, f, 61), losses(be, {n});
          Tensor dlogits(be, s, x);
          be.cross_entropy(logits, targets, 1.0f / static_cast<float>(n), losses, with_grad ? &dlogits : nullptr);
          std::vector<Output> o{out(be, "losses", losses)};
          if (with_grad) o.push_back(out(be, "dlogits", dlogits));
          return o;
        });
        // Ignored targets (-1, data.document_mask's masked positions): loss 0, gradient row 0.
        add("cross_entropy_ignore_" + d + g + sx, kTolFp32, [=](Backend& be) {
          Tensor logits = input(be, s, 60, x, -6, 6), targets = class_targets(be, n, f, 61, 3), losses(be, {n});
          Tensor dlogits = input(be, s, 67, x);  // overwritten
          be.cross_entropy(logits, targets, 1.0f / static_cast<float>(n), losses, with_grad ? &dlogits : nullptr);
          std::vector<Output> o{out(be, "losses", losses)};
          if (with_grad) o.push_back(out(be, "dlogits", dlogits));
          return o;
        });
        add("vocab_parallel_cross_entropy_ignore_" + d + g + sx, kTolFp32, [=](Backend& be) {
          Tensor logits = input(be, s, 64, x, -6, 6), targets = class_targets(be, n, f + 7, 65, 2), losses(be, {n});
          Tensor mx(be, {n}), partial(be, {n, 2}), dlogits = input(be, s, 68, x);
          be.row_max(logits, mx);
          be.cross_entropy_partial(logits, targets, 3, mx, partial);
          Tensor total = input(be, {n, 2}, 66, 1, 2);
          be.cross_entropy_finish(logits, targets, 3, mx, total, 1.0f / static_cast<float>(n), losses,
                                  with_grad ? &dlogits : nullptr);
          std::vector<Output> o{out(be, "partial", partial), out(be, "losses", losses)};
          if (with_grad) o.push_back(out(be, "dlogits", dlogits));
          return o;
        });
        // Vocabulary-parallel cross-entropy's three steps, as one tp rank holding columns [3, 3 + f) of
        // f + 7 (targets below 3 are another rank's); the totals stand in for the group's all-reduces.
        add("vocab_parallel_cross_entropy_" + d + g + sx, kTolFp32, [=](Backend& be) {
          Tensor logits = input(be, s, 64, x, -6, 6), targets = class_targets(be, n, f + 7, 65), losses(be, {n});
          Tensor mx(be, {n}), partial(be, {n, 2}), dlogits(be, s, x);
          be.row_max(logits, mx);
          be.cross_entropy_partial(logits, targets, 3, mx, partial);
          Tensor total = input(be, {n, 2}, 66, 1, 2);
          be.cross_entropy_finish(logits, targets, 3, mx, total, 1.0f / static_cast<float>(n), losses,
                                  with_grad ? &dlogits : nullptr);
          std::vector<Output> o{out(be, "row_max", mx), out(be, "partial", partial), out(be, "losses", losses)};
          if (with_grad) o.push_back(out(be, "dlogits", dlogits));
          return o;
        });
        add("mse_" + d + g + sx, kTolFp32, [=](Backend& be) {
          Tensor pred = input(be, s, 62, x), target = input(be, s, 63, x), losses(be, {n}), dpred(be, s, x);
          be.mse(pred, target, 1.0f / static_cast<float>(n), losses, with_grad ? &dpred : nullptr);
          std::vector<Output> o{out(be, "losses", losses)};
          if (with_grad) o.push_back(out(be, "dpred", dpred));
          return o;
        });
      }
      add("argmax_" + d + sx, kTolExact, [=](Backend& be) {
        Tensor logits = input(be, s, 64, x), idx(be, {n}, DType::i32);
        be.argmax(logits, idx);
        return std::vector{out(be, "argmax", idx)};
      });
      add("argmax_ties_" + d + sx, kTolExact, [=](Backend& be) {
        Tensor logits = input_with_ties(be, s, 65, x), idx(be, {n}, DType::i32);
        be.argmax(logits, idx);
        return std::vector{out(be, "argmax", idx)};
      });

      // residual add, also in place (y aliasing a)
      add("add_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor a = input(be, s, 90, x), b = input(be, s, 91, x), y(be, s, x);
        be.add(a, b, y);
        be.add(a, b, a);
        return std::vector{out(be, "y", y), out(be, "a_inplace", a)};
      });
    }
    // cross-entropy over a vocabulary, its gradient written over the logits (a language model's loss)
    for (int64_t V : {int64_t(65), int64_t(50257)}) {
      add("cross_entropy_inplace_16x" + std::to_string(V) + sx, kTolFp32, [=](Backend& be) {
        Tensor logits = input(be, {16, V}, 92, x, -8, 8), targets = class_targets(be, 16, V, 93), losses(be, {16});
        be.cross_entropy(logits, targets, 1.0f / 16, losses, &logits);
        return std::vector{out(be, "losses", losses), out(be, "dlogits", logits)};
      });
    }
  }

  // FP8's amax pass (the tensor-parallel and ZeRO-3 FP8 gather's first pass): each tile's max |x| as float bits, an
  // exact max on both backends; shapes off every 128 edge, a NaN and an inf in rows that the tiles keep apart.
  for (DType x : float_types)
    for (Fp8Tiling tiling : {Fp8Tiling::tensor, Fp8Tiling::row_1x128, Fp8Tiling::col_128x1, Fp8Tiling::block_128x128})
      for (bool special : {false, true})
        add(std::string("fp8_amax_") +
                (tiling == Fp8Tiling::tensor ? "tensor" : tiling == Fp8Tiling::row_1x128 ? "1x128"
                 : tiling == Fp8Tiling::col_128x1 ? "128x1" : "128x128") +
                (special ? "_nan_inf" : "") + "_130x257" + suffix(x),
            kTolExact,
            [=](Backend& be) {
              Tensor t = input(be, {130, 257}, 44, x, -3, 3);
              if (special) {
                Tensor host = input(cpu_backend(), {130, 257}, 44, x, -3, 3);
                const float nan = std::nanf(""), inf = INFINITY;
                if (x == DType::f32) host.f32()[5] = nan, host.f32()[129 * 257 + 256] = -inf;
                else host.b16()[5] = f32_to_bf16(nan), host.b16()[129 * 257 + 256] = f32_to_bf16(-inf);
                be.upload(t, host.raw());
              }
              const Fp8Grid g = fp8_grid(tiling, 130, 257);
              Tensor amax(be, {g.rows, g.cols}, DType::i32);  // (grid) |x|'s max as float bits
              be.fp8_amax(t, tiling, amax);
              Output o = out(be, "amax", amax);
              o.exact = true;
              return std::vector{o};
            });

  // FP8 codes and scales (kernels/cuda/fp8_quantize.cu against kernels/cpu/fp8_quantize.cpp): bit for bit, every
  // tiling and format, 130 x 257 (off every 128 edge) holding zeros, values far below their tile's amax (the
  // format's subnormals), the tile maxima themselves (the max finite code) and an all-zero 1 x 128 tile; "_allzero"
  // an all-zero tensor (scale 1); "_given_amax" quantises with an amax a quarter of the true one, so that most codes
  // saturate, as a shard's agreed amax never would but the kernel must still get right.
  for (DType x : float_types)
    for (DType qt : {DType::fp8_e4m3, DType::fp8_e5m2})
      for (Fp8Tiling tiling : {Fp8Tiling::tensor, Fp8Tiling::row_1x128, Fp8Tiling::col_128x1, Fp8Tiling::block_128x128})
        for (const char* variant : {"", "_allzero", "_given_amax"})
          add(std::string("fp8_quantize_") +
                  (tiling == Fp8Tiling::tensor ? "tensor" : tiling == Fp8Tiling::row_1x128 ? "1x128"
                   : tiling == Fp8Tiling::col_128x1 ? "128x1" : "128x128") +
                  (qt == DType::fp8_e4m3 ? "_e4m3" : "_e5m2") + variant + "_130x257" + suffix(x),
              kTolExact, [=](Backend& be) {
                const int64_t R = 130, C = 257;
                Tensor host = input(cpu_backend(), {R, C}, 45, x, -3, 3);
                for (int64_t i = 0; i < R * C; ++i) {
                  float v = x == DType::f32 ? host.f32()[i] : bf16_to_f32(host.b16()[i]);
                  if (std::string(variant) == "_allzero" || (i / C == 7 && i % C < 128)) v = 0.f;  // zero tile
                  else if (i % 11 == 0) v = 0.f;
                  else if (i % 13 == 0) v *= 1e-4f;  // subnormal codes at e4m3's scale, tiny normals in e5m2
                  else if (i % 17 == 0) v *= 1e-7f;  // rounds to zero or the smallest subnormal
                  v = bf16_to_f32(f32_to_bf16(v));  // bf16 values in both rows (Bf16Ops: bit for bit too)
                  if (x == DType::f32) host.f32()[i] = v;
                  else host.b16()[i] = f32_to_bf16(v);
                }
                Tensor t(be, {R, C}, x);
                be.upload(t, host.raw());
                const Fp8Grid g = fp8_grid(tiling, R, C);
                Tensor q(be, {R, C}, qt), scales(be, {g.rows, g.cols});  // codes; (grid) f32 scales
                if (std::string(variant) == "_given_amax") {
                  Tensor amax(be, {g.rows, g.cols}, DType::i32);  // (grid) |x|'s max as float bits
                  be.fp8_amax(t, tiling, amax);
                  std::vector<int32_t> bits(static_cast<size_t>(g.rows * g.cols));
                  be.download(bits.data(), amax);
                  for (int32_t& b : bits)
                    if (b > (2 << 23)) b -= 2 << 23;  // a quarter: two binades down
                  be.upload(amax, bits.data());
                  be.fp8_quantize_amax(t, tiling, amax, q, scales);
                } else {
                  be.fp8_quantize(t, tiling, q, scales);
                }
                Output s = out(be, "scales", scales);
                s.exact = true;
                return std::vector{out(be, "codes", q), s};
              });

  // FP8 GEMMs (the Relay CUDA kernel against kernels/cpu/fp8_gemm.cpp): every (trans_a, trans_b), tensorwise with an
  // e4m3 a and an e5m2 b (the input-gradient GEMM's formats), blockwise all e4m3 (1 x 128 / 128 x 1 tiles along k
  // for a, 128 x 128 blocks for b), op(a) 130 x 260, op(b) 260 x 67: off every 128 edge in m, n and k; beta 0 and 0.5.
  // Each backend quantises its own operands (bit for bit, the rows above).
  for (bool blockwise : {false, true})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.f, 0.5f})
          add(std::string("fp8_matmul_") + (blockwise ? "blockwise" : "tensor") + (ta ? "_ta" : "_na") +
                  (tb ? "_tb" : "_nb") + (beta != 0.f ? "_beta" : "") + "_130x260x67",
              kTolFp8Gemm, [=](Backend& be) {
                const int64_t M = 130, K = 260, N = 67;
                const Shape as = ta ? Shape{K, M} : Shape{M, K}, bs = tb ? Shape{N, K} : Shape{K, N};
                const Fp8Tiling at = !blockwise ? Fp8Tiling::tensor : ta ? Fp8Tiling::col_128x1 : Fp8Tiling::row_1x128;
                const Fp8Tiling bt = blockwise ? Fp8Tiling::block_128x128 : Fp8Tiling::tensor;
                const DType bq = blockwise ? DType::fp8_e4m3 : DType::fp8_e5m2;
                Tensor a = input(be, as, 46, -2, 2), b = input(be, bs, 47, -0.5, 0.5);
                const Fp8Grid ga = fp8_grid(at, as[0], as[1]), gb = fp8_grid(bt, bs[0], bs[1]);
                Tensor aq(be, as, DType::fp8_e4m3), bqt(be, bs, bq);
                Tensor a_scales(be, {ga.rows, ga.cols}), b_scales(be, {gb.rows, gb.cols});
                be.fp8_quantize(a, at, aq, a_scales);
                be.fp8_quantize(b, bt, bqt, b_scales);
                Tensor y = input(be, {M, N}, 48);
                be.fp8_matmul(aq, a_scales, at, ta, bqt, b_scales, bt, tb, y, beta);
                return std::vector{out(be, "y", y)};
              });

  // FP8 GEMMs on cuBLASLt (src/backend/cuda_backend.cpp's fp8_matmul_lt, kernels/fp8_lt_layout.hpp's plan) against
  // the CPU emulation: shapes on the alignment rule (m 144, n 160, k 272 or 256: multiples of 16, two 128-row blocks
  // of op(b)^T, k blocks 2 (padded to 4 for BLK128x128) or 3 with a partial last one), every (trans_a, trans_b) so
  // that every transposed copy and scale relayout runs, beta 0 and 1, y f32 and bf16 ("_ybf16", not "_bf16": no
  // Bf16Ops pair). Tensorwise e4m3 x e4m3 (forward) and e5m2 x e4m3 (input gradient; e5m2 x e5m2 has no cuBLASLt
  // kernel); blockwise all e4m3, a in 1 x 128 tiles along k, b in 128 x 128 blocks (forward, input gradient) or in
  // 1 x 128 tiles along k (the weight gradient's dy^T @ x). The shapes off the rule are the fp8_matmul rows above
  // (the plain kernel). RELAY_FP8_GEMM=lt: a GEMM the plan gives to cuBLASLt throws rather than falling back (sm_89+
  // tensorwise, sm_90 blockwise; elsewhere the plan picks the plain kernel and the row checks that).
  {
    struct Fp8LtRow {
      std::string name;
      Fp8Tiling at, bt;
      DType aq, bq, yt;
      bool ta, tb;
      float beta;
      int64_t k;
    };
    std::vector<Fp8LtRow> rows;
    const char* tr[2][2] = {{"_na_nb", "_na_tb"}, {"_ta_nb", "_ta_tb"}};
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        for (DType aq : {DType::fp8_e4m3, DType::fp8_e5m2})
          for (float beta : {0.f, 1.f})
            for (DType yt : {DType::f32, DType::bf16}) {
              if (yt == DType::bf16 && aq == DType::fp8_e5m2) continue;
              rows.push_back({std::string("fp8_lt_tensor_") + (aq == DType::fp8_e4m3 ? "e4m3" : "e5m2") + "xe4m3" +
                                  tr[ta][tb] + (beta != 0.f ? "_beta" : "") + (yt == DType::bf16 ? "_ybf16" : ""),
                              Fp8Tiling::tensor, Fp8Tiling::tensor, aq, DType::fp8_e4m3, yt, ta, tb, beta, 272});
            }
        const Fp8Tiling at = ta ? Fp8Tiling::col_128x1 : Fp8Tiling::row_1x128;
        for (Fp8Tiling bt : {Fp8Tiling::block_128x128, tb ? Fp8Tiling::row_1x128 : Fp8Tiling::col_128x1})
          for (int64_t k : {256, 272})
            for (float beta : {0.f, 1.f})
              for (DType yt : {DType::f32, DType::bf16}) {
                if (yt == DType::bf16 && beta != 0.f) continue;
                rows.push_back({std::string("fp8_lt_blockwise_") +
                                    (bt == Fp8Tiling::block_128x128 ? "1x128x128x128" : "1x128x1x128") + tr[ta][tb] +
                                    (beta != 0.f ? "_beta" : "") + (yt == DType::bf16 ? "_ybf16" : "") + "_144x" +
                                    std::to_string(k) + "x160",
                                at, bt, DType::fp8_e4m3, DType::fp8_e4m3, yt, ta, tb, beta, k});
              }
      }
    for (const Fp8LtRow& r : rows)
      add(r.name + (r.name.find("_144x") == std::string::npos ? "_144x272x160" : ""), kTolFp8Lt, [r](Backend& be) {
        const int64_t M = 144, N = 160, K = r.k;
        const int64_t ar = r.ta ? K : M, ac = r.ta ? M : K, br = r.tb ? N : K, bc = r.tb ? K : N;
        Tensor a = fp8_tiled_input(be, ar, ac, 146), b = fp8_tiled_input(be, br, bc, 147);
        const Fp8Grid ga = fp8_grid(r.at, ar, ac), gb = fp8_grid(r.bt, br, bc);
        Tensor aq(be, {ar, ac}, r.aq), bq(be, {br, bc}, r.bq);                   // codes as stored
        Tensor a_scales(be, {ga.rows, ga.cols}), b_scales(be, {gb.rows, gb.cols});  // (grid) f32
        be.fp8_quantize(a, r.at, aq, a_scales);
        be.fp8_quantize(b, r.bt, bq, b_scales);
        Tensor y = input(be, {M, N}, 148, r.yt);
        struct LtOnly {  // RELAY_FP8_GEMM=lt for this GEMM only, also when it throws
          LtOnly() { setenv("RELAY_FP8_GEMM", "lt", 1); }
          ~LtOnly() { unsetenv("RELAY_FP8_GEMM"); }
        };
        {
          LtOnly lt_only;
          be.fp8_matmul(aq, a_scales, r.at, r.ta, bq, b_scales, r.bt, r.tb, y, r.beta);
        }
        return std::vector{out(be, "y", y)};
      });
  }

  // sum of squares (gradient norms: float32 only)
  for (const Shape& s : shapes)
    add("sum_squares_" + dims(s), kTolSumSq, [s](Backend& be) {
      Tensor x = input(be, s, 41, -3, 3);
      return std::vector{Output{"sum", {be.sum_squares(x)}}};
    });

  // optimizers: three steps, each with a new gradient, on float32 masters and state; the bf16 rows also
  // write the working copy in the same pass
  for (const Shape& s : shapes) {
    const std::string d = dims(s);
    for (bool with_work : {false, true}) {
      const std::string w = with_work ? "_bf16_work" : "";
      add("adamw_3_steps_" + d + w, kTolFp32, [=](Backend& be) {
        Tensor p = input(be, s, 70), m(be, s), v(be, s);
        Tensor work = with_work ? Tensor(be, s, DType::bf16) : Tensor();
        be.fill(m, 0.0f);
        be.fill(v, 0.0f);
        for (int64_t step = 1; step <= 3; ++step) {
          Tensor g = input(be, s, 70 + static_cast<uint64_t>(step), -0.1, 0.1);
          be.adamw_step(p, g, m, v, AdamWArgs{1e-2, 0.9, 0.999, 1e-8, 0.1, step}, work);
        }
        std::vector<Output> o{out(be, "param", p), out(be, "exp_avg", m), out(be, "exp_avg_sq", v)};
        if (with_work) o.push_back(out(be, "work", work));
        return o;
      });
      for (double momentum : {0.0, 0.9}) {
        add(std::string("sgd_3_steps_") + (momentum == 0.0 ? "plain_" : "momentum_") + d + w, kTolFp32,
            [=](Backend& be) {
              Tensor p = input(be, s, 80);
              Tensor buf = momentum != 0.0 ? Tensor(be, s) : Tensor();  // undefined without momentum
              Tensor work = with_work ? Tensor(be, s, DType::bf16) : Tensor();
              for (int step = 0; step < 3; ++step) {
                Tensor g = input(be, s, 81 + static_cast<uint64_t>(step));
                be.sgd_step(p, g, buf, SgdArgs{0.05, momentum, 0.01, step == 0}, work);
              }
              std::vector<Output> o{out(be, "param", p)};
              if (momentum != 0.0) o.push_back(out(be, "momentum_buffer", buf));
              if (with_work) o.push_back(out(be, "work", work));
              return o;
            });
      }
    }
  }

  // AdamW on many tensors in one call (adamw_step_many: CUDA's multi-tensor kernel, the CPU's one parallel pass):
  // 41 tensors, more than a CUDA launch's pack of 36, one a chunk (65536 elements) and one more, the rest small.
  for (bool with_work : {false, true})
    add(std::string("adamw_many_3_steps_41_tensors") + (with_work ? "_bf16_work" : ""), kTolFp32, [=](Backend& be) {
      std::vector<Tensor> p, m, v, work;
      for (int64_t i = 0; i < 41; ++i) {
        const Shape s = i == 7 ? Shape{65537} : i == 30 ? Shape{256, 256} : Shape{1 + (i * 37) % 90, 3};
        p.push_back(input(be, s, 100 + uint64_t(i)));
        m.emplace_back(be, s);
        v.emplace_back(be, s);
        be.fill(m.back(), 0.0f);
        be.fill(v.back(), 0.0f);
        work.push_back(with_work ? Tensor(be, s, DType::bf16) : Tensor());
      }
      for (int64_t step = 1; step <= 3; ++step) {
        std::vector<Tensor> g;  // (each tensor's shape) this step's gradients
        for (int64_t i = 0; i < 41; ++i)
          g.push_back(input(be, p[size_t(i)].shape(), 300 + uint64_t(step * 41 + i), -0.1, 0.1));
        std::vector<Backend::AdamWSlot> slots;
        for (size_t i = 0; i < p.size(); ++i) slots.push_back({&p[i], &g[i], &m[i], &v[i], &work[i]});
        be.adamw_step_many(slots, AdamWArgs{1e-2, 0.9, 0.999, 1e-8, 0.1, step});
      }
      std::vector<Output> o;
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string t = std::to_string(i);
        for (Output x : {out(be, "param" + t, p[i]), out(be, "exp_avg" + t, m[i]), out(be, "exp_avg_sq" + t, v[i])})
          o.push_back(std::move(x));
        if (with_work) o.push_back(out(be, "work" + t, work[i]));
      }
      return o;
    });

  // GPT-2: embedding with repeated tokens (its backward accumulates), attention, KV-cache decoding
  struct Gpt { int64_t B, T, H, C, V; };
  for (Gpt g : {Gpt{1, 1, 1, 4, 7}, Gpt{2, 5, 2, 6, 11}, Gpt{3, 64, 4, 64, 300}, Gpt{2, 256, 12, 768, 50257}}) {
    const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) + "_C" +
                          std::to_string(g.C);
    const int64_t n = g.B * g.T;
    for (DType x : float_types) {
      const std::string sx = suffix(x);
      // dwte, dwpe are float32 whatever dout is
      add("embedding_forward_backward_" + d + "_V" + std::to_string(g.V) + sx, kTolFp32, [=](Backend& be) {
        Tensor tok = class_targets(be, n, std::min<int64_t>(g.V, 5), 94);  // ids 0..4: many repeats
        Tensor wte = input(be, {g.V, g.C}, 95, x), wpe = input(be, {g.T, g.C}, 96, x), y(be, {n, g.C}, x);
        be.embedding_forward(tok, wte, wpe, g.T, y);
        Tensor dy = input(be, {n, g.C}, 97, x), dwte = input(be, {g.V, g.C}, 98), dwpe = input(be, {g.T, g.C}, 99);
        be.embedding_backward(tok, dy, g.T, dwte, dwpe);
        return std::vector{out(be, "y", y), out(be, "dwte", dwte), out(be, "dwpe", dwpe)};
      });
      // Positions restarting with each document (data.document_mask): wpe read and its gradient summed by position.
      add("embedding_document_positions_" + d + "_V" + std::to_string(g.V) + sx, kTolFp32, [=](Backend& be) {
        std::vector<int32_t> ds, pos;
        document_layout_rows(g.B, g.T, 107, ds, pos);
        Tensor tok = class_targets(be, n, std::min<int64_t>(g.V, 5), 94), p = i32_tensor(be, pos);
        Tensor wte = input(be, {g.V, g.C}, 95, x), wpe = input(be, {g.T, g.C}, 96, x), y(be, {n, g.C}, x);
        be.embedding_forward(tok, wte, wpe, g.T, y, 0, p);
        Tensor dy = input(be, {n, g.C}, 97, x), dwte = input(be, {g.V, g.C}, 98), dwpe = input(be, {g.T, g.C}, 99);
        be.embedding_backward(tok, dy, g.T, dwte, dwpe, 0, p);
        return std::vector{out(be, "y", y), out(be, "dwte", dwte), out(be, "dwpe", dwpe)};
      });
      // Vocabulary-parallel: this rank holds rows [2, 2 + V/2 + 1) and adds no positions.
      add("embedding_vocab_shard_" + d + "_V" + std::to_string(g.V) + sx, kTolFp32, [=](Backend& be) {
        const int64_t rows = g.V / 2 + 1;
        Tensor tok = class_targets(be, n, std::min<int64_t>(g.V, 5), 103);
        Tensor wte = input(be, {rows, g.C}, 104, x), y(be, {n, g.C}, x), none;
        be.embedding_forward(tok, wte, none, g.T, y, 2);
        Tensor dy = input(be, {n, g.C}, 105, x), dwte = input(be, {rows, g.C}, 106);
        be.embedding_backward(tok, dy, g.T, dwte, none, 2);
        return std::vector{out(be, "y", y), out(be, "dwte", dwte)};
      });
      if (g.T <= 64)
        add("attention_decode_" + d + sx, kTolAttention, [=](Backend& be) {
          Tensor qkv = input(be, {g.T, 3 * g.C}, 103, x, -2, 2);  // positions of one sequence, decoded one by one
          Tensor kc(be, {1, g.T, g.C}, x), vc(be, {1, g.T, g.C}, x), o(be, {g.T, g.C}, x);
          for (int64_t t = 0; t < g.T; ++t) {
            Tensor ot = o.rows(t, 1);
            be.attention_decode(qkv.rows(t, 1), kc, vc, t, g.H, ot);
          }
          return std::vector{out(be, "out", o), out(be, "kcache", kc), out(be, "vcache", vc)};
        });
    }
    // the reference attention with its probabilities: float32 only
    add("attention_forward_backward_" + d, kTolAttention, [g, n](Backend& be) {
      Tensor qkv = input(be, {n, 3 * g.C}, 100, -2, 2), att(be, {g.B, g.H, g.T, g.T}), y(be, {n, g.C});
      be.attention_forward(qkv, g.B, g.T, g.H, att, y);
      Tensor dy = input(be, {n, g.C}, 101), dqkv = input(be, {n, 3 * g.C}, 102);  // overwritten
      be.attention_backward(dy, qkv, att, g.B, g.T, g.H, dqkv);
      return std::vector{out(be, "out", y), out(be, "att", att), out(be, "dqkv", dqkv)};
    });
  }

  // FlashAttention-2, CUDA against the CPU's, float32 and bfloat16. T not a multiple of any tile (GPU
  // 16, 8, 32; CPU 128), and head sizes 3, 4, 16, 64, 96, 128 (one to four head dims per lane on the GPU).
  // The backward rows take out and lse from the CPU's forward on both backends, so that they measure the
  // backward kernels alone.
  struct Flash { int64_t B, T, H, C; };
  for (Flash g : {Flash{1, 1, 1, 4}, Flash{2, 5, 2, 6}, Flash{3, 64, 4, 64}, Flash{2, 100, 2, 256},
                  Flash{1, 257, 3, 288}, Flash{2, 256, 12, 768}}) {
    const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) + "_C" +
                          std::to_string(g.C);
    const int64_t n = g.B * g.T;
    for (DType x : float_types) {
      const std::string sx = suffix(x);
      add("flash_attention_forward_" + d + sx, kTolFlash, [=](Backend& be) {
        Tensor qkv = input(be, {n, 3 * g.C}, 110, x, -2, 2), y(be, {n, g.C}, x), lse(be, {g.B, g.H, g.T});
        be.flash_attention_forward(qkv, g.B, g.T, g.H, y, lse);
        return std::vector{out(be, "out", y), out(be, "lse", lse)};
      });
      add("flash_attention_backward_" + d + sx, kTolFlash, [=](Backend& be) {
        Backend& cpu = cpu_backend();
        Tensor qkv_ref = input(cpu, {n, 3 * g.C}, 111, x, -2, 2);
        Tensor y_ref(cpu, {n, g.C}, x), lse_ref(cpu, {g.B, g.H, g.T});
        cpu.flash_attention_forward(qkv_ref, g.B, g.T, g.H, y_ref, lse_ref);
        Tensor qkv = copy_to(be, qkv_ref), y = copy_to(be, y_ref), lse = copy_to(be, lse_ref);
        Tensor dy = input(be, {n, g.C}, 112, x), dqkv = input(be, {n, 3 * g.C}, 113, x);  // overwritten
        be.flash_attention_backward(dy, qkv, y, lse, g.B, g.T, g.H, dqkv);
        return std::vector{out(be, "dqkv", dqkv)};
      });
      // data.document_mask: each query sees its document's keys only (documents of 1 to 2T/3 rows), forward and
      // backward (the backward from the CPU's masked forward, as above).
      add("flash_attention_documents_" + d + sx, kTolFlash, [=](Backend& be) {
        std::vector<int32_t> ds, pos;
        document_layout_rows(g.B, g.T, 114, ds, pos);
        Backend& cpu = cpu_backend();
        Tensor qkv_ref = input(cpu, {n, 3 * g.C}, 115, x, -2, 2), ds_ref = i32_tensor(cpu, ds);
        Tensor y_ref(cpu, {n, g.C}, x), lse_ref(cpu, {g.B, g.H, g.T});
        cpu.flash_attention_forward(qkv_ref, g.B, g.T, g.H, y_ref, lse_ref, ds_ref);
        Tensor qkv = copy_to(be, qkv_ref), doc = i32_tensor(be, ds), y(be, {n, g.C}, x), lse(be, {g.B, g.H, g.T});
        be.flash_attention_forward(qkv, g.B, g.T, g.H, y, lse, doc);
        Tensor y0 = copy_to(be, y_ref), lse0 = copy_to(be, lse_ref);
        Tensor dy = input(be, {n, g.C}, 116, x), dqkv = input(be, {n, 3 * g.C}, 117, x);  // overwritten
        be.flash_attention_backward(dy, qkv, y0, lse0, g.B, g.T, g.H, dqkv, doc);
        return std::vector{out(be, "out", y), out(be, "lse", lse), out(be, "dqkv", dqkv)};
      });
    }
  }

  // Llama: RMSNorm, SwiGLU (also in place: dgate over gate, dup over up), rotary embeddings (forward and the
  // inverse in place), grouped-query flash attention and decoding. KV in {H, H/2, 1}, head dims 16 and 64,
  // T not a multiple of any tile (CPU 128; GPU 16, 8, 32).
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (const Shape& s : shapes) {
      const std::string d = dims(s);
      const int64_t n = s[0], f = s[1];
      add("rmsnorm_forward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, s, 120, x, -1, 3), gamma = input(be, {f}, 121, x, 0.5, 1.5);
        Tensor y(be, s, x), rstd(be, {n});
        be.rmsnorm_forward(xin, gamma, 1e-5f, y, rstd);
        return std::vector{out(be, "y", y), out(be, "rstd", rstd)};
      });
      add("rmsnorm_backward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, s, 122, x, -1, 3), gamma = input(be, {f}, 123, x, 0.5, 1.5);
        Tensor y(be, s, x), rstd(be, {n}), dx(be, s, x);
        be.rmsnorm_forward(xin, gamma, 1e-5f, y, rstd);
        Tensor dy = input(be, s, 124, x), dgamma = input(be, {f}, 125);  // accumulated into
        be.rmsnorm_backward_input(dy, xin, gamma, rstd, dx);
        be.rmsnorm_backward_weight(dy, xin, rstd, dgamma);
        return std::vector{out(be, "dx", dx), out(be, "dgamma", dgamma)};
      });
      add("swiglu_forward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor gate = input(be, s, 126, x, -8, 8), up = input(be, s, 127, x), h(be, s, x);
        be.swiglu_forward(gate, up, h);
        return std::vector{out(be, "h", h)};
      });
      add("swiglu_backward_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor gate = input(be, s, 128, x, -8, 8), up = input(be, s, 129, x), dh = input(be, s, 130, x);
        Tensor dgate(be, s, x), dup(be, s, x);
        be.swiglu_backward(dh, gate, up, dgate, dup);
        return std::vector{out(be, "dgate", dgate), out(be, "dup", dup)};
      });
      add("swiglu_backward_inplace_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor gate = input(be, s, 128, x, -8, 8), up = input(be, s, 129, x), dh = input(be, s, 130, x);
        be.swiglu_backward(dh, gate, up, gate, up);
        return std::vector{out(be, "dgate", gate), out(be, "dup", up)};
      });
    }
    struct Rope { int64_t n, T, heads, hd, pos0; double theta; };
    for (Rope g : {Rope{1, 1, 1, 2, 0, 10000.0}, Rope{10, 5, 2, 16, 0, 10000.0}, Rope{74, 37, 3, 64, 7, 10000.0},
                   Rope{3, 1, 4, 128, 1000, 500000.0}}) {
      const std::string d = "n" + std::to_string(g.n) + "_T" + std::to_string(g.T) + "_heads" +
                            std::to_string(g.heads) + "_hd" + std::to_string(g.hd) + "_pos" + std::to_string(g.pos0);
      add("rope_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, {g.n, g.heads * g.hd}, 131, x, -2, 2), y(be, {g.n, g.heads * g.hd}, x);
        be.rope(xin, g.T, g.hd, g.theta, g.pos0, false, y);
        be.rope(xin, g.T, g.hd, g.theta, g.pos0, true, xin);  // the backward, in place
        return std::vector{out(be, "y", y), out(be, "inverse_inplace", xin)};
      });
      // YaRN (model.rope_scaling = "yarn", DeepSeek-V3's factor 40 over 4096 positions, beta 32 and 1; mscale 0: the
      // cos/sin factor 0.1 ln 40 + 1): blended frequencies on the ramp between low and high, the factor on cos and sin.
      const RopeScaling yarn = yarn_scaling(40.0, 4096.0, 32.0, 1.0, 0.0, 0.0, g.hd, g.theta);
      add("rope_yarn_" + d + sx, kTolFp32, [=](Backend& be) {
        Tensor xin = input(be, {g.n, g.heads * g.hd}, 133, x, -2, 2), y(be, {g.n, g.heads * g.hd}, x);
        be.rope(xin, g.T, g.hd, g.theta, g.pos0, false, y, Tensor(), yarn);
        be.rope(xin, g.T, g.hd, g.theta, g.pos0, true, xin, Tensor(), yarn);  // the backward, in place
        return std::vector{out(be, "y", y), out(be, "backward_inplace", xin)};
      });
      if (g.n % g.T == 0 && g.pos0 == 0)  // positions restarting with each document (data.document_mask)
        add("rope_document_positions_" + d + sx, kTolFp32, [=](Backend& be) {
          std::vector<int32_t> ds, pos;
          document_layout_rows(g.n / g.T, g.T, 132, ds, pos);
          Tensor p = i32_tensor(be, pos);
          Tensor xin = input(be, {g.n, g.heads * g.hd}, 131, x, -2, 2), y(be, {g.n, g.heads * g.hd}, x);
          be.rope(xin, g.T, g.hd, g.theta, 0, false, y, p);
          be.rope(xin, g.T, g.hd, g.theta, 0, true, xin, p);
          return std::vector{out(be, "y", y), out(be, "inverse_inplace", xin)};
        });
    }
    // MLA's rotary regrouping (gather_rotary, scatter_rotary): x (n, heads * w), columns [off, off + dr) of each head;
    // one head of only rotary columns (k_pe), and (1024, 4 x 32) above the CPU's parallel threshold.
    struct Rot { int64_t n, heads, w, off, dr; };
    for (Rot g : {Rot{1, 1, 8, 0, 8}, Rot{37, 3, 12, 4, 8}, Rot{1024, 4, 32, 24, 8}})
      for (bool il : {true, false}) {
        const std::string d = "n" + std::to_string(g.n) + "_heads" + std::to_string(g.heads) + "_w" +
                              std::to_string(g.w) + "_off" + std::to_string(g.off) + "_dr" + std::to_string(g.dr) +
                              (il ? "_interleaved" : "");
        add("rotary_columns_" + d + sx, kTolExact, [=](Backend& be) {
          Tensor xin = input(be, {g.n, g.heads * g.w}, 134, x), pe(be, {g.n, g.heads * g.dr}, x);
          Tensor into = input(be, {g.n, g.heads * g.w}, 135, x), pe2 = input(be, {g.n, g.heads * g.dr}, 136, x);
          be.gather_rotary(xin, g.w, g.off, il, pe);
          be.scatter_rotary(pe2, g.w, g.off, il, into);  // into's other columns stay
          return std::vector{out(be, "pe", pe), out(be, "x", into)};
        });
      }
    struct Gqa { int64_t B, T, H, KV, hd; };
    for (Gqa g : {Gqa{1, 1, 1, 1, 16}, Gqa{2, 37, 4, 4, 16}, Gqa{2, 37, 4, 2, 16}, Gqa{2, 37, 4, 1, 16},
                  Gqa{1, 130, 4, 4, 64}, Gqa{1, 130, 4, 2, 64}, Gqa{2, 130, 4, 1, 64}}) {
      const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) +
                            "_KV" + std::to_string(g.KV) + "_hd" + std::to_string(g.hd);
      const int64_t n = g.B * g.T, C = g.H * g.hd, Ckv = g.KV * g.hd;
      add("flash_attention_gqa_forward_" + d + sx, kTolFlash, [=](Backend& be) {
        Tensor q = input(be, {n, C}, 132, x, -2, 2), k = input(be, {n, Ckv}, 133, x, -2, 2);
        Tensor v = input(be, {n, Ckv}, 134, x, -2, 2), y(be, {n, C}, x), lse(be, {g.B, g.H, g.T});
        be.flash_attention_gqa_forward(q, k, v, g.B, g.T, g.H, g.KV, y, lse);
        return std::vector{out(be, "out", y), out(be, "lse", lse)};
      });
      add("flash_attention_gqa_backward_" + d + sx, kTolFlash, [=](Backend& be) {
        Backend& cpu = cpu_backend();
        Tensor q_ref = input(cpu, {n, C}, 135, x, -2, 2), k_ref = input(cpu, {n, Ckv}, 136, x, -2, 2);
        Tensor v_ref = input(cpu, {n, Ckv}, 137, x, -2, 2), y_ref(cpu, {n, C}, x), lse_ref(cpu, {g.B, g.H, g.T});
        cpu.flash_attention_gqa_forward(q_ref, k_ref, v_ref, g.B, g.T, g.H, g.KV, y_ref, lse_ref);
        Tensor q = copy_to(be, q_ref), k = copy_to(be, k_ref), v = copy_to(be, v_ref);
        Tensor y = copy_to(be, y_ref), lse = copy_to(be, lse_ref);
        Tensor dy = input(be, {n, C}, 138, x), dq = input(be, {n, C}, 139, x);  // overwritten
        Tensor dk = input(be, {n, Ckv}, 140, x), dv = input(be, {n, Ckv}, 141, x);
        be.flash_attention_gqa_backward(dy, q, k, v, y, lse, g.B, g.T, g.H, g.KV, dq, dk, dv);
        return std::vector{out(be, "dq", dq), out(be, "dk", dk), out(be, "dv", dv)};
      });
      add("flash_attention_gqa_documents_" + d + sx, kTolFlash, [=](Backend& be) {  // data.document_mask
        std::vector<int32_t> ds, pos;
        document_layout_rows(g.B, g.T, 142, ds, pos);
        Backend& cpu = cpu_backend();
        Tensor q_ref = input(cpu, {n, C}, 135, x, -2, 2), k_ref = input(cpu, {n, Ckv}, 136, x, -2, 2);
        Tensor v_ref = input(cpu, {n, Ckv}, 137, x, -2, 2), y_ref(cpu, {n, C}, x), lse_ref(cpu, {g.B, g.H, g.T});
        cpu.flash_attention_gqa_forward(q_ref, k_ref, v_ref, g.B, g.T, g.H, g.KV, y_ref, lse_ref, i32_tensor(cpu, ds));
        Tensor q = copy_to(be, q_ref), k = copy_to(be, k_ref), v = copy_to(be, v_ref), doc = i32_tensor(be, ds);
        Tensor y(be, {n, C}, x), lse(be, {g.B, g.H, g.T});
        be.flash_attention_gqa_forward(q, k, v, g.B, g.T, g.H, g.KV, y, lse, doc);
        Tensor y0 = copy_to(be, y_ref), lse0 = copy_to(be, lse_ref);
        Tensor dy = input(be, {n, C}, 138, x), dq = input(be, {n, C}, 139, x);  // overwritten
        Tensor dk = input(be, {n, Ckv}, 140, x), dv = input(be, {n, Ckv}, 141, x);
        be.flash_attention_gqa_backward(dy, q, k, v, y0, lse0, g.B, g.T, g.H, g.KV, dq, dk, dv, doc);
        return std::vector{out(be, "out", y), out(be, "lse", lse), out(be, "dq", dq), out(be, "dk", dk),
                           out(be, "dv", dv)};
      });
      if (g.T <= 64)
        add("attention_decode_gqa_" + d + sx, kTolAttention, [=](Backend& be) {
          // g.B sequences decoded together, position after position: rows t of (T, ...) per sequence.
          Tensor q = input(be, {g.T, g.B * C}, 142, x, -2, 2), k = input(be, {g.T, g.B * Ckv}, 143, x, -2, 2);
          Tensor v = input(be, {g.T, g.B * Ckv}, 144, x, -2, 2), o(be, {g.T, g.B * C}, x);
          Tensor kc(be, {g.B, g.T, Ckv}, x), vc(be, {g.B, g.T, Ckv}, x);
          for (int64_t t = 0; t < g.T; ++t) {
            Tensor ot = o.rows(t, 1).view({g.B, C});
            be.attention_decode_gqa(q.rows(t, 1).view({g.B, C}), k.rows(t, 1).view({g.B, Ckv}),
                                    v.rows(t, 1).view({g.B, Ckv}), kc, vc, t, g.H, g.KV, ot);
          }
          return std::vector{out(be, "out", o), out(be, "kcache", kc), out(be, "vcache", vc)};
        });
    }
  }

  // Context parallelism's positioned attention (flash_attention_gqa_forward_at / _backward_at): one cp rank's
  // Tq = Tk / cp query rows of each sequence against all Tk keys. Positions as training lays them out
  // (cp_position: chunks rank and 2cp - 1 - rank of 2cp, the load-balanced split), or one contiguous middle chunk
  // [first, first + Tq); with the document mask each query's document start is its position's. T never a multiple
  // of the GPU's tiles (16, 8, 32) and not of the CPU's (128); a key no query sees gets zero gradients.
  struct At { int64_t B, Tk, cp, rank, first, H, KV, hd; };  // first < 0: cp rank `rank`'s zigzag chunks
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (At g : {At{2, 76, 2, 0, -1, 4, 2, 16}, At{2, 76, 2, 1, -1, 4, 4, 16}, At{1, 264, 4, 1, -1, 4, 1, 64},
                 At{1, 264, 4, 3, -1, 4, 2, 64}, At{1, 130, 3, 0, 50, 4, 2, 64}, At{2, 40, 2, 1, -1, 2, 1, 128},
                 At{1, 36, 3, 2, -1, 3, 3, 40}, At{2, 37, 1, 0, 0, 4, 2, 16}}) {
      const int64_t Tq = g.Tk / g.cp, nq = g.B * Tq, nk = g.B * g.Tk, C = g.H * g.hd, Ckv = g.KV * g.hd;
      const std::string d = "B" + std::to_string(g.B) + "_Tk" + std::to_string(g.Tk) + "_Tq" + std::to_string(Tq) +
                            (g.first < 0 ? "_cp" + std::to_string(g.cp) + "rank" + std::to_string(g.rank)
                                         : "_from" + std::to_string(g.first)) +
                            "_H" + std::to_string(g.H) + "_KV" + std::to_string(g.KV) + "_hd" + std::to_string(g.hd);
      std::vector<int32_t> q_pos(static_cast<size_t>(nq));  // (B*Tq) each query row's key position
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t t = 0; t < Tq; ++t)
          q_pos[static_cast<size_t>(b * Tq + t)] =
              static_cast<int32_t>(g.first < 0 ? cp_position(g.Tk, int(g.cp), int(g.rank), t) : g.first + t);
      std::vector<int32_t> key_start, unused, q_start(static_cast<size_t>(nq));  // (B*Tk) and (B*Tq) document starts
      document_layout_rows(g.B, g.Tk, 150, key_start, unused);
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t t = 0; t < Tq; ++t)
          q_start[static_cast<size_t>(b * Tq + t)] = key_start[static_cast<size_t>(b * g.Tk + q_pos[size_t(b * Tq + t)])];
      for (bool docs : {false, true}) {
        const std::string dd = docs ? "_documents" : "";
        add("flash_attention_at_forward_" + d + dd + sx, kTolFlash, [=](Backend& be) {
          Tensor q = input(be, {nq, C}, 151, x, -2, 2), k = input(be, {nk, Ckv}, 152, x, -2, 2);
          Tensor v = input(be, {nk, Ckv}, 153, x, -2, 2), y(be, {nq, C}, x), lse(be, {g.B, g.H, Tq});
          const Tensor pos = i32_tensor(be, q_pos), doc = docs ? i32_tensor(be, q_start) : Tensor();
          be.flash_attention_gqa_forward_at(q, k, v, g.B, Tq, g.Tk, pos, g.H, g.KV, y, lse, doc);
          return std::vector{out(be, "out", y), out(be, "lse", lse)};
        });
        // The backward from the CPU's forward (the same out and lse on both backends).
        add("flash_attention_at_backward_" + d + dd + sx, kTolFlash, [=](Backend& be) {
          Backend& cpu = cpu_backend();
          Tensor q_ref = input(cpu, {nq, C}, 154, x, -2, 2), k_ref = input(cpu, {nk, Ckv}, 155, x, -2, 2);
          Tensor v_ref = input(cpu, {nk, Ckv}, 156, x, -2, 2), y_ref(cpu, {nq, C}, x), lse_ref(cpu, {g.B, g.H, Tq});
          cpu.flash_attention_gqa_forward_at(q_ref, k_ref, v_ref, g.B, Tq, g.Tk, i32_tensor(cpu, q_pos), g.H, g.KV,
                                             y_ref, lse_ref, docs ? i32_tensor(cpu, q_start) : Tensor());
          Tensor q = copy_to(be, q_ref), k = copy_to(be, k_ref), v = copy_to(be, v_ref);
          Tensor y = copy_to(be, y_ref), lse = copy_to(be, lse_ref);
          const Tensor pos = i32_tensor(be, q_pos), doc = docs ? i32_tensor(be, q_start) : Tensor();
          Tensor dy = input(be, {nq, C}, 157, x), dq = input(be, {nq, C}, 158, x);  // overwritten
          Tensor dk = input(be, {nk, Ckv}, 159, x), dv = input(be, {nk, Ckv}, 160, x);
          be.flash_attention_gqa_backward_at(dy, q, k, v, y, lse, g.B, Tq, g.Tk, pos, g.H, g.KV, dq, dk, dv, doc);
          return std::vector{out(be, "dq", dq), out(be, "dk", dk), out(be, "dv", dv)};
        });
      }
    }
  }

  // Context parallelism's merge of two partial attentions (attention_merge, parallel.overlap): out and lse of part 1
  // overwritten with the merge with part 2. lse values in [-3, 3] with every 5th of part 1 and every 7th of part 2
  // -inf (a query that sees no key of that part: its out there is garbage, here NaN, and must never be read), so some
  // rows have both -inf (left as they were); hd 16, 40, 128 (DeepSeek-V3's value head), fp32 and bf16.
  struct Merge { int64_t B, T, H, hd; };
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (Merge g : {Merge{1, 1, 1, 16}, Merge{2, 13, 3, 40}, Merge{2, 37, 4, 128}}) {
      const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) +
                            "_hd" + std::to_string(g.hd);
      add("attention_merge_" + d + sx, kTolFlash, [=](Backend& be) {
        const int64_t n = g.B * g.T, C = g.H * g.hd, rows = g.B * g.H * g.T;
        std::vector<float> l1 = random_values(rows, 171, -3, 3), l2 = random_values(rows, 172, -3, 3);  // (B, H, T)
        std::vector<float> o1 = random_values(n * C, 174, -2, 2), o2 = random_values(n * C, 173, -2, 2);  // (n, C)
        for (int64_t i = 0; i < rows; i += 5) l1[size_t(i)] = -INFINITY;
        for (int64_t i = 0; i < rows; i += 7) l2[size_t(i)] = -INFINITY;
        for (int64_t i = 0; i < rows; ++i) {  // i = (b H + h) T + t; a part's out where its lse is -inf: NaN garbage
          const int64_t b = i / (g.H * g.T), h = i / g.T % g.H, t = i % g.T;
          for (int64_t j = 0; j < g.hd; ++j) {
            const size_t at = size_t((b * g.T + t) * C + h * g.hd + j);
            if (l1[size_t(i)] == -INFINITY) o1[at] = NAN;
            if (l2[size_t(i)] == -INFINITY) o2[at] = NAN;
          }
        }
        Tensor o(be, {n, C}, x), o2t(be, {n, C}, x), lse(be, {g.B, g.H, g.T}), lse2(be, {g.B, g.H, g.T});
        upload_values(be, o, o1);
        upload_values(be, o2t, o2);
        be.upload(lse, l1.data());
        be.upload(lse2, l2.data());
        be.attention_merge(o, lse, o2t, lse2, g.B, g.T, g.H);
        return std::vector{out(be, "out", o), out(be, "lse", lse)};
      });
    }
  }

  // DeepSeek-V3 (issue 42's CUDA part; not yet run on a GPU). Multi-head latent attention's training attention: value
  // heads of another width than the query/key heads (hd_v != hd), causal, with and without the document mask, and
  // context parallelism's positioned form; shapes of configs/deepseek-v3-small-bytes.toml (hd 32 = 24 + 8, hd_v 16),
  // the full-size model's (hd 192 = 128 + 64, hd_v 128) and a grouped-query one whose value heads are the wider.
  struct Mla { int64_t B, T, H, KV, hd, hd_v; };
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (Mla g : {Mla{2, 37, 4, 4, 32, 16}, Mla{1, 130, 2, 2, 192, 128}, Mla{2, 37, 4, 2, 24, 40}}) {
      const std::string d = "B" + std::to_string(g.B) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) +
                            "_KV" + std::to_string(g.KV) + "_hd" + std::to_string(g.hd) + "_hdv" +
                            std::to_string(g.hd_v);
      const int64_t n = g.B * g.T, C = g.H * g.hd, Ck = g.KV * g.hd, Co = g.H * g.hd_v, Cv = g.KV * g.hd_v;
      add("mla_attention_forward_" + d + sx, kTolFlash, [=](Backend& be) {
        Tensor q = input(be, {n, C}, 232, x, -2, 2), k = input(be, {n, Ck}, 233, x, -2, 2);
        Tensor v = input(be, {n, Cv}, 234, x, -2, 2), y(be, {n, Co}, x), lse(be, {g.B, g.H, g.T});
        be.flash_attention_gqa_forward(q, k, v, g.B, g.T, g.H, g.KV, y, lse);
        return std::vector{out(be, "out", y), out(be, "lse", lse)};
      });
      for (bool docs : {false, true})  // the backward from the CPU's forward (the same out and lse on both backends)
        add("mla_attention_backward_" + d + (docs ? "_documents" : "") + sx, kTolFlash, [=](Backend& be) {
          std::vector<int32_t> ds, pos;
          document_layout_rows(g.B, g.T, 242, ds, pos);
          Backend& cpu = cpu_backend();
          Tensor q_ref = input(cpu, {n, C}, 235, x, -2, 2), k_ref = input(cpu, {n, Ck}, 236, x, -2, 2);
          Tensor v_ref = input(cpu, {n, Cv}, 237, x, -2, 2), y_ref(cpu, {n, Co}, x), lse_ref(cpu, {g.B, g.H, g.T});
          cpu.flash_attention_gqa_forward(q_ref, k_ref, v_ref, g.B, g.T, g.H, g.KV, y_ref, lse_ref,
                                          docs ? i32_tensor(cpu, ds) : Tensor());
          Tensor q = copy_to(be, q_ref), k = copy_to(be, k_ref), v = copy_to(be, v_ref);
          const Tensor doc = docs ? i32_tensor(be, ds) : Tensor();
          std::vector<Output> outs;
          if (docs) {  // the forward under the mask too
            Tensor y(be, {n, Co}, x), lse(be, {g.B, g.H, g.T});
            be.flash_attention_gqa_forward(q, k, v, g.B, g.T, g.H, g.KV, y, lse, doc);
            outs = {out(be, "out", y), out(be, "lse", lse)};
          }
          Tensor y = copy_to(be, y_ref), lse = copy_to(be, lse_ref);
          Tensor dy = input(be, {n, Co}, 238, x), dq = input(be, {n, C}, 239, x);  // overwritten
          Tensor dk = input(be, {n, Ck}, 240, x), dv = input(be, {n, Cv}, 241, x);
          be.flash_attention_gqa_backward(dy, q, k, v, y, lse, g.B, g.T, g.H, g.KV, dq, dk, dv, doc);
          for (auto [name, t] : {std::pair{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}) outs.push_back(out(be, name, *t));
          return outs;
        });
    }
    // Context parallelism: cp rank `rank`'s zigzag chunks of each sequence against all Tk keys, with and without
    // documents (each query's document start its position's), as the Llama rows above.
    struct MlaAt { int64_t B, Tk, cp, rank, H, KV, hd, hd_v; };
    for (MlaAt g : {MlaAt{2, 76, 2, 1, 4, 4, 32, 16}, MlaAt{1, 264, 4, 2, 2, 2, 192, 128}}) {
      const int64_t Tq = g.Tk / g.cp, nq = g.B * Tq, nk = g.B * g.Tk;
      const int64_t C = g.H * g.hd, Ck = g.KV * g.hd, Co = g.H * g.hd_v, Cv = g.KV * g.hd_v;
      const std::string d = "B" + std::to_string(g.B) + "_Tk" + std::to_string(g.Tk) + "_cp" + std::to_string(g.cp) +
                            "rank" + std::to_string(g.rank) + "_H" + std::to_string(g.H) + "_hd" +
                            std::to_string(g.hd) + "_hdv" + std::to_string(g.hd_v);
      std::vector<int32_t> q_pos(static_cast<size_t>(nq)), key_start, unused, q_start(static_cast<size_t>(nq));
      document_layout_rows(g.B, g.Tk, 250, key_start, unused);
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t t = 0; t < Tq; ++t) {
          const size_t i = static_cast<size_t>(b * Tq + t);
          q_pos[i] = static_cast<int32_t>(cp_position(g.Tk, int(g.cp), int(g.rank), t));
          q_start[i] = key_start[static_cast<size_t>(b * g.Tk + q_pos[i])];
        }
      for (bool docs : {false, true})
        add("mla_attention_at_" + d + (docs ? "_documents" : "") + sx, kTolFlash, [=](Backend& be) {
          Backend& cpu = cpu_backend();
          Tensor q_ref = input(cpu, {nq, C}, 251, x, -2, 2), k_ref = input(cpu, {nk, Ck}, 252, x, -2, 2);
          Tensor v_ref = input(cpu, {nk, Cv}, 253, x, -2, 2), y_ref(cpu, {nq, Co}, x), lse_ref(cpu, {g.B, g.H, Tq});
          cpu.flash_attention_gqa_forward_at(q_ref, k_ref, v_ref, g.B, Tq, g.Tk, i32_tensor(cpu, q_pos), g.H, g.KV,
                                             y_ref, lse_ref, docs ? i32_tensor(cpu, q_start) : Tensor());
          Tensor q = copy_to(be, q_ref), k = copy_to(be, k_ref), v = copy_to(be, v_ref);
          const Tensor pos = i32_tensor(be, q_pos), doc = docs ? i32_tensor(be, q_start) : Tensor();
          Tensor y(be, {nq, Co}, x), lse(be, {g.B, g.H, Tq});
          be.flash_attention_gqa_forward_at(q, k, v, g.B, Tq, g.Tk, pos, g.H, g.KV, y, lse, doc);
          Tensor y0 = copy_to(be, y_ref), lse0 = copy_to(be, lse_ref);  // the backward from the CPU's forward
          Tensor dy = input(be, {nq, Co}, 254, x), dq = input(be, {nq, C}, 255, x);  // overwritten
          Tensor dk = input(be, {nk, Ck}, 256, x), dv = input(be, {nk, Cv}, 257, x);
          be.flash_attention_gqa_backward_at(dy, q, k, v, y0, lse0, g.B, Tq, g.Tk, pos, g.H, g.KV, dq, dk, dv, doc);
          return std::vector{out(be, "out", y), out(be, "lse", lse), out(be, "dq", dq), out(be, "dk", dk),
                             out(be, "dv", dv)};
        });
    }
    // The absorbed decode over the compressed cache (attention_decode_latent): n sequences decoded together, position
    // after position (rows t of (T, ...)); the small config's cache rows (r 32 + dr 8) and the full size's (512 + 64).
    struct Latent { int64_t n, T, H, r, dr; };
    for (Latent g : {Latent{2, 20, 4, 32, 8}, Latent{1, 40, 3, 512, 64}}) {
      const int64_t dk = g.r + g.dr;
      add("mla_decode_latent_n" + std::to_string(g.n) + "_T" + std::to_string(g.T) + "_H" + std::to_string(g.H) +
              "_r" + std::to_string(g.r) + "_dr" + std::to_string(g.dr) + sx,
          kTolAttention, [=](Backend& be) {
            Tensor q = input(be, {g.T, g.n * g.H * dk}, 260, x, -1, 1), kv = input(be, {g.T, g.n * dk}, 261, x, -1, 1);
            Tensor o(be, {g.T, g.n * g.H * g.r}, x), cache(be, {g.n, g.T, dk}, x);
            const float scale = 0.37f;  // the model's 1/sqrt(dn + dr) times YaRN's mscale^2
            for (int64_t t = 0; t < g.T; ++t) {
              Tensor ot = o.rows(t, 1).view({g.n, g.H * g.r});
              be.attention_decode_latent(q.rows(t, 1).view({g.n, g.H * dk}), kv.rows(t, 1).view({g.n, dk}), cache, t,
                                         g.H, scale, ot);
            }
            return std::vector{out(be, "out", o), out(be, "cache", cache)};
          });
    }
    // DeepSeek-V3's router (moe_group_router_forward / _backward): sigmoid scores, the correction bias on the choice
    // only, group-limited top-k, renormalisation, routed scaling 2.5. Shapes (E, n_group, topk_group, k): the small
    // config's, the full model's (256, 8, 4, 8), no group limit (topk_group = n_group, and n_group 1), groups of one
    // expert. Logits from a few values, so that rows hold exact ties of experts and of groups (group_router_logits):
    // the tie order must be the CPU's, bit for bit.
    for (GroupShape m : group_shapes()) {
      const std::string ek = "E" + std::to_string(m.E) + "_g" + std::to_string(m.n_group) + "_top" +
                             std::to_string(m.topk_group) + "_k" + std::to_string(m.k);
      for (bool renorm : {false, true}) {
        const Backend::GroupRouting r{m.k, m.n_group, m.topk_group, renorm, 2.5f};
        const std::string rn = renorm ? "_renorm" : "";
        for (bool biased : {false, true})
          add("moe_group_router_forward_" + ek + rn + (biased ? "_bias" : "") + sx, kTolFp32, [=](Backend& be) {
            std::vector<Output> outs;
            for (int64_t n : kMoeTokens) {
              Tensor logits(be, {n, m.E}, x), bias;
              upload_values(be, logits, group_router_logits(n, m.E));
              if (biased) {
                bias = Tensor(be, {m.E});
                upload_values(be, bias, group_router_bias(m.E));
              }
              Tensor probs(be, {n, m.E}), experts(be, {n, m.k}, DType::i32), weights(be, {n, m.k});
              be.moe_group_router_forward(logits, r, probs, experts, weights, bias);
              const std::string sn = "_n" + std::to_string(n);
              outs.push_back(out(be, "experts" + sn, experts));
              outs.back().exact = true;
              outs.push_back(out(be, "probs" + sn, probs));
              outs.push_back(out(be, "weights" + sn, weights));
            }
            return outs;
          });
        // The backward from the CPU's forward (the same probabilities and choices on both backends), with and without
        // the sequence-wise loss's gradient.
        add("moe_group_router_backward_" + ek + rn + sx, kTolFp32, [=](Backend& be) {
          Backend& cpu = cpu_backend();
          std::vector<Output> outs;
          for (int64_t n : kMoeTokens) {
            Tensor logits(cpu, {n, m.E}, x), bias(cpu, {m.E}), probs_ref(cpu, {n, m.E});
            Tensor experts_ref(cpu, {n, m.k}, DType::i32), weights_ref(cpu, {n, m.k});
            upload_values(cpu, logits, group_router_logits(n, m.E));
            upload_values(cpu, bias, group_router_bias(m.E));
            cpu.moe_group_router_forward(logits, r, probs_ref, experts_ref, weights_ref, bias);
            Tensor probs = copy_to(be, probs_ref), experts = copy_to(be, experts_ref);
            Tensor dweights = input(be, {n, m.k}, 272);
            const int64_t T = n == 64 ? 16 : n == 300 ? 100 : n;  // several sequences for the larger n
            Tensor seq_grad = input(be, {n / T, m.E}, 273, -0.1, 0.1);
            for (bool seq : {false, true}) {
              Tensor dlogits = input(be, {n, m.E}, 274, x);  // overwritten
              be.moe_group_router_backward(probs, experts, dweights, r, seq ? seq_grad : Tensor(), T, dlogits);
              outs.push_back(out(be, "dlogits_n" + std::to_string(n) + (seq ? "_seq" : ""), dlogits));
            }
          }
          return outs;
        });
      }
    }
  }

  // Mixture of experts (model/moe.cpp): the router over (E, k) x renormalisation x expert bias, its backward with and
  // without the aux loss's per-sequence gradient (T rows per sequence) and the z-loss, the combine (weighted, and
  // unweighted as the backward uses it) and its backward over random row permutations. Each row runs n = 1, 7, 64,
  // 300 tokens. The chosen experts must be the CPU's bit for bit (exact outputs); probabilities, lse and weights
  // are float math in another order (kTolFp32); drows are single products (bit for bit in practice).
  for (DType x : float_types) {
    const std::string sx = suffix(x);
    for (MoeShape m : moe_shapes()) {
      const std::string ek = "E" + std::to_string(m.E) + "_k" + std::to_string(m.k);
      for (bool renorm : {false, true}) {
        const std::string rn = renorm ? "_renorm" : "";
        for (bool biased : {false, true})
          add("moe_router_forward_" + ek + rn + (biased ? "_bias" : "") + sx, kTolFp32, [=](Backend& be) {
            std::vector<Output> outs;
            for (int64_t n : kMoeTokens) {
              Tensor logits(be, {n, m.E}, x), bias;
              upload_values(be, logits, router_logits(n, m.E));
              if (biased) {
                bias = Tensor(be, {m.E});
                upload_values(be, bias, router_bias(m.E));
              }
              Tensor probs(be, {n, m.E}), lse(be, {n}), experts(be, {n, m.k}, DType::i32), weights(be, {n, m.k});
              be.moe_router_forward(logits, m.k, renorm, probs, lse, experts, weights, bias);
              const std::string sn = "_n" + std::to_string(n);
              outs.push_back(out(be, "experts" + sn, experts));
              outs.back().exact = true;
              for (auto [name, t] : {std::pair{"probs", &probs}, {"lse", &lse}, {"weights", &weights}})
                outs.push_back(out(be, name + sn, *t));
            }
            return outs;
          });
        // The backward from the CPU's forward (the same probabilities and choices on both backends).
        add("moe_router_backward_" + ek + rn + sx, kTolFp32, [=](Backend& be) {
          Backend& cpu = cpu_backend();
          std::vector<Output> outs;
          for (int64_t n : kMoeTokens) {
            Tensor logits(cpu, {n, m.E}, x), probs_ref(cpu, {n, m.E}), lse_ref(cpu, {n});
            Tensor experts_ref(cpu, {n, m.k}, DType::i32), weights_ref(cpu, {n, m.k});
            upload_values(cpu, logits, router_logits(n, m.E));
            cpu.moe_router_forward(logits, m.k, renorm, probs_ref, lse_ref, experts_ref, weights_ref);
            Tensor probs = copy_to(be, probs_ref), lse = copy_to(be, lse_ref), experts = copy_to(be, experts_ref);
            Tensor dweights = input(be, {n, m.k}, 172);
            const int64_t T = n == 64 ? 16 : n == 300 ? 100 : n;  // several sequences for the larger n
            Tensor seq_grad = input(be, {n / T, m.E}, 173, -0.1, 0.1);
            for (auto [name, seq, z] : {std::tuple{"", false, 0.0f}, {"_seq", true, 0.0f}, {"_z", false, 0.01f},
                                        {"_seq_z", true, 0.01f}}) {
              Tensor dlogits = input(be, {n, m.E}, 174, x);  // overwritten
              be.moe_router_backward(probs, lse, experts, dweights, renorm, seq ? seq_grad : Tensor(), T, z, dlogits);
              outs.push_back(out(be, "dlogits_n" + std::to_string(n) + name, dlogits));
            }
          }
          return outs;
        });
      }
    }
    for (int64_t k : {1, 2, 8})
      for (int64_t C : {3, 130}) {
        const std::string kc = "k" + std::to_string(k) + "_C" + std::to_string(C);
        for (bool weighted : {true, false})
          add("moe_combine_" + kc + (weighted ? "" : "_unweighted") + sx, kTolFp32, [=](Backend& be) {
            std::vector<Output> outs;
            for (int64_t n : kMoeTokens) {
              Tensor rows = input(be, {n * k, C}, 175, x), weights = input(be, {n, k}, 176, 0.0, 1.0);
              Tensor pos = row_permutation(be, n, k, 177 + static_cast<uint64_t>(n));
              Tensor y = input(be, {n, C}, 178, x);  // overwritten
              be.moe_combine(rows, pos, weighted ? weights : Tensor(), y);
              outs.push_back(out(be, "y_n" + std::to_string(n), y));
            }
            return outs;
          });
        add("moe_combine_backward_" + kc + sx, kTolFp32, [=](Backend& be) {
          std::vector<Output> outs;
          for (int64_t n : kMoeTokens) {
            Tensor dy = input(be, {n, C}, 179, x), rows = input(be, {n * k, C}, 180, x);
            Tensor weights = input(be, {n, k}, 181, 0.0, 1.0);
            Tensor pos = row_permutation(be, n, k, 182 + static_cast<uint64_t>(n));
            Tensor drows = input(be, {n * k, C}, 183, x), dweights = input(be, {n, k}, 184);  // overwritten
            be.moe_combine_backward(dy, rows, pos, weights, drows, dweights);
            const std::string sn = "_n" + std::to_string(n);
            outs.push_back(out(be, "drows" + sn, drows));
            outs.push_back(out(be, "dweights" + sn, dweights));
          }
          return outs;
        });
      }
  }
  return cases;
}

// --- comparison --------------------------------------------------------------------------------

// Max |got - ref| relative to max(max |ref|, kScaleFloor) over the finite values at most tol; NaN and
// infinities must match exactly. The rows' inputs are O(1), so their outputs are too, except an output that is
// zero in exact arithmetic (dq of attention over one key, dx of an RMSNorm or LayerNorm of one element): its
// values are rounding noise of O(1) terms, and relative to their own tiny maximum they would fail any tolerance
// (seen on an H100: 1.2e-7 against 2e-8). Such an output, under 1/1000 of its row's largest |ref| (floor), is
// compared on the scale of the row; any output at least on a scale of 1/100 (kScaleFloor).
// what: the output ("add_3x7: output y"); ref_side, got_side: the two runs ("cpu", "cuda").
void expect_within(const std::string& what, const Output& ref, const Output& got, double tol, const char* ref_side,
                   const char* got_side, const char* note = "", double floor = 0.0) {
  ASSERT_EQ(ref.values.size(), got.values.size()) << what << ": sizes differ";
  double scale = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < ref.values.size(); ++i) {
    const double r = ref.values[i], g = got.values[i];
    if (std::isnan(r) || std::isnan(g)) {
      ASSERT_TRUE(std::isnan(r) && std::isnan(g))
          << what << "[" << i << "] " << ref_side << " " << r << " vs " << got_side << " " << g;
      continue;
    }
    if (std::isinf(r) || std::isinf(g)) {
      ASSERT_EQ(r, g) << what << "[" << i << "] " << ref_side << " " << r << " vs " << got_side << " " << g;
      continue;
    }
    scale = std::max(scale, std::fabs(r));
    if (std::fabs(r - g) > worst) {
      worst = std::fabs(r - g);
      worst_at = i;
    }
  }
  constexpr double kScaleFloor = 0.01;
  const double base = scale < 1e-3 * floor ? floor : scale;  // a structurally zero output: its row's scale
  const double err = worst / std::max(base, kScaleFloor);
  EXPECT_LE(err, tol) << what << " max |" << got_side << " - " << ref_side << "| = " << worst << " at [" << worst_at
                      << "] (" << ref_side << " " << ref.values[worst_at] << ", " << got_side << " "
                      << got.values[worst_at] << "), relative to " << std::max(base, kScaleFloor) << " (max |" << ref_side
                      << "| = " << scale << "): " << err
                      << " > tolerance " << tol << note;
}

// A CUDA output against the CPU's: same dtype; a bf16 output gets one bf16 ulp more than the row's tolerance.
// row_scale: the largest |value| over the row's reference outputs.
void expect_close(const std::string& name, const Output& ref, const Output& got, double row_tol, double row_scale) {
  ASSERT_EQ(ref.bf16, got.bf16) << name << ": output " << ref.name << " dtypes differ";
  if (ref.exact) row_tol = kTolExact;
  const bool ulp = row_tol > 0.0 && ref.bf16;
  expect_within(name + ": output " + ref.name, ref, got, ulp ? row_tol + kBf16Ulp : row_tol, "cpu", "cuda",
                ulp ? " (the row's plus one bf16 ulp)" : "", row_scale);
}

// Sets both backends' precision for a row; false (with the reason) when a backend cannot run it.
bool set_precisions(Precision p, std::string& why) {
  try {
    cpu_backend().set_precision(p == Precision::tf32 ? Precision::fp32 : p);
    cuda_backend().set_precision(p);
  } catch (const Error& e) {
    why = e.what();
    return false;
  }
  return true;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(BackendOps, CudaMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  const OpCase& c = GetParam();
  std::string why;
  if (!set_precisions(c.precision, why))
    GTEST_SKIP() << "precision " << precision_name(c.precision) << " is not available here: " << why;
  std::vector<Output> ref = c.run(cpu_backend());
  std::vector<Output> got = c.run(cuda_backend());
  set_precisions(Precision::fp32, why);
  ASSERT_EQ(ref.size(), got.size());
  double row_scale = 0.0;
  for (const Output& o : ref)
    for (double v : o.values)
      if (std::isfinite(v)) row_scale = std::max(row_scale, std::fabs(v));
  for (size_t i = 0; i < ref.size(); ++i) expect_close(c.name, ref[i], got[i], c.tolerance, row_scale);
}

INSTANTIATE_TEST_SUITE_P(AllOps, BackendOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

// --- bf16 against fp32, on the CPU ------------------------------------------------------------

// The fp32 twin of a bf16 row: add_3x7_bf16 -> add_3x7; matmul_3x7x5_nn_bf16(_y_f32) -> matmul_3x7x5_nn_fp32;
// adamw_3_steps_3x7_bf16_work -> adamw_3_steps_3x7. Empty when the table has none.
const OpCase* fp32_twin(const std::vector<OpCase>& all, const std::string& name) {
  const size_t at = name.find("_bf16");
  if (at == std::string::npos) return nullptr;
  const std::string head = name.substr(0, at), tail = name.substr(at + 5);
  for (const std::string& cand : {head + tail, head + "_fp32" + tail, head + "_fp32", head})
    for (const OpCase& c : all)
      if (c.name == cand) return &c;
  return nullptr;
}

// Tolerance of a bf16 row against its fp32 twin, relative to the twin's largest output magnitude.
// Inputs are the same bf16 values, math is float in both, so what differs is bf16 storage:
constexpr double kBf16OneRounding = 0x1p-8;  // an output rounded once to bf16 (8 significant bits: half an ulp
                                             // is 2^-8 of the value at most); GEMMs with a float y: exact
                                             // products, the same float accumulation
constexpr double kBf16TwoStages = 0x1p-6;    // ops whose float result passes through a bf16 intermediate or
                                             // whose output feeds a second rounding (LayerNorm backward, flash
                                             // attention's bf16 output re-read in its backward, AdamW's working
                                             // copy after three steps, attention decode, a GELU of a bf16
                                             // pre-activation): four roundings
double bf16_tolerance(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("copy") || starts("upload") || starts("argmax") || starts("convert")) return kTolExact;
  if (starts("layernorm_backward") || starts("flash_attention") || starts("attention") || starts("mla_") ||
      starts("adamw") ||
      starts("sgd") || starts("embedding") || starts("vocab_parallel") || starts("cross_entropy") ||
      starts("linear_gelu") || starts("linear_backward_input_gelu"))
    return kBf16TwoStages;
  return kBf16OneRounding;
}

// A bf16 row and its fp32 twin.
struct Bf16Pair {
  OpCase bf16, fp32;
};
void PrintTo(const Bf16Pair& p, std::ostream* os) { *os << p.bf16.name; }
std::vector<Bf16Pair> bf16_pairs() {
  const std::vector<OpCase> all = all_cases();
  std::vector<Bf16Pair> pairs;
  for (const OpCase& c : all)
    if (const OpCase* twin = fp32_twin(all, c.name); twin && c.name.rfind("fill", 0) != 0)  // fills: other constants
      pairs.push_back({c, *twin});
  return pairs;
}

class Bf16Ops : public ::testing::TestWithParam<Bf16Pair> {};

// Every op in bf16 against its fp32 result on bf16-representable inputs, on the CPU (no GPU needed). An
// optimizer's bf16 working copy is checked against the fp32 twin's updated parameter.
TEST_P(Bf16Ops, MatchFp32OnCpu) {
  const Bf16Pair& p = GetParam();
  try {  // oneDNN's bf16 GEMMs need AVX512: skipped, with the reason, on a CPU without
    cpu_backend().set_precision(Precision::bf16);
  } catch (const relay::Error& e) {
    cpu_backend().set_precision(Precision::fp32);
    GTEST_SKIP() << e.what();
  }
  cpu_backend().set_precision(Precision::fp32);
  g_bf16_representable_inputs = true;  // also the bf16 row's f32 inputs (optimizer masters, gradients)
  std::vector<Output> ref = p.fp32.run(cpu_backend());
  if (p.bf16.precision == Precision::bf16) cpu_backend().set_precision(Precision::bf16);
  std::vector<Output> got = p.bf16.run(cpu_backend());
  g_bf16_representable_inputs = false;
  cpu_backend().set_precision(Precision::fp32);
  const double tol = bf16_tolerance(p.bf16.name);
  for (const Output& g : got) {
    const bool work = g.name.rfind("work", 0) == 0;  // a working copy ("work", "work3"): its parameter's twin
    const std::string ref_name = work ? "param" + g.name.substr(4) : g.name;
    auto r = std::find_if(ref.begin(), ref.end(), [&](const Output& o) { return o.name == ref_name; });
    ASSERT_NE(r, ref.end()) << p.fp32.name << " has no output " << ref_name;
    expect_within(p.bf16.name + " against " + p.fp32.name + ": output " + g.name, *r, g,
                  r->exact ? kTolExact : work ? kBf16OneRounding : tol, "fp32", "bf16");
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, Bf16Ops, ::testing::ValuesIn(bf16_pairs()),
                         [](const ::testing::TestParamInfo<Bf16Pair>& info) { return info.param.bf16.name; });

// The CUDA FlashAttention kernels stop at head dimension 192 (a register tile per lane, DeepSeek-V3's query/key
// heads); a larger one is the user's model choice, refused with an error that names the op, not a crash. The
// grouped-query ops refuse a value head above it too.
TEST(BackendOpsFlash, CudaRefusesHeadDimAbove192) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  Backend& gpu = cuda_backend();
  const int64_t B = 1, T = 4, H = 2, C = 400;  // hd = 200
  Tensor qkv(gpu, {B * T, 3 * C}), y(gpu, {B * T, C}), lse(gpu, {B, H, T});
  try {
    gpu.flash_attention_forward(qkv, B, T, H, y, lse);
    ADD_FAILURE() << "flash_attention_forward accepted head dimension 200";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("flash_attention_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("200"), std::string::npos) << what;
  }
  Tensor q(gpu, {B * T, H * 64}), k(gpu, {B * T, H * 64}), v(gpu, {B * T, H * 200}), o(gpu, {B * T, H * 200});
  try {
    gpu.flash_attention_gqa_forward(q, k, v, B, T, H, H, o, lse);
    ADD_FAILURE() << "flash_attention_gqa_forward accepted value head dimension 200";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("flash_attention_gqa_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("200"), std::string::npos) << what;
  }
}

// The routing rows' inputs decide every choice by a margin far above float rounding (router_logits), so a row that
// finds other experts on the GPU has found a kernel's mistake. On the CPU: no GPU needed.
TEST(BackendOpsMoe, RouterInputsHaveNoNearTies) {
  for (MoeShape m : moe_shapes())
    for (int64_t n : kMoeTokens)
      for (bool biased : {false, true}) {
        const double margin = router_margin(router_logits(n, m.E), n, m.E, m.k,
                                            biased ? router_bias(m.E) : std::vector<float>());
        // 1e-5: some 40 float ulps of a score below 2 (a probability plus a bias of 0 or 1)
        EXPECT_GT(margin, 1e-5) << "E " << m.E << ", k " << m.k << ", n " << n << (biased ? ", bias" : "");
      }
}

// The group router rows' choice scores (sigmoid(logit) + bias, each bias with its own logits) and their pairwise sums
// (group scores): any two different ones are at least 1e-4 apart in double, far above float rounding (~1e-7), so the
// experts and groups the GPU chooses can differ from the CPU's only by a kernel's mistake. With and without the bias.
TEST(BackendOpsMoe, GroupRouterInputsHaveNoNearTies) {
  for (bool biased : {false, true}) {
    std::vector<double> c;  // the distinct choice scores
    for (int i = 0; i < 3; ++i)
      for (float z : kGroupLogits[i]) c.push_back(1.0 / (1.0 + std::exp(-double(z))) + (biased ? kGroupBias[i] : 0.0));
    std::vector<double> sums;  // a group's score: the sum of two of them (the same one twice when tied)
    for (size_t i = 0; i < c.size(); ++i)
      for (size_t j = i; j < c.size(); ++j) sums.push_back(c[i] + c[j]);
    for (std::vector<double>* v : {&c, &sums}) {
      std::sort(v->begin(), v->end());
      for (size_t i = 1; i < v->size(); ++i)
        EXPECT_GT((*v)[i] - (*v)[i - 1], 1e-4) << (biased ? "biased " : "") << (v == &c ? "scores " : "sums ") << i;
    }
  }
}

// The router keeps each lane's chosen experts in a 64-bit mask: above 32 x 64 experts the CUDA backend refuses the
// model by name (an Error naming model.n_experts), never a wrong choice.
TEST(BackendOpsMoe, CudaRefusesMoreThan2048Experts) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  Backend& gpu = cuda_backend();
  const int64_t n = 2, E = 2049, k = 2;
  Tensor logits(gpu, {n, E}), probs(gpu, {n, E}), lse(gpu, {n}), experts(gpu, {n, k}, DType::i32), w(gpu, {n, k});
  try {
    gpu.moe_router_forward(logits, k, true, probs, lse, experts, w);
    ADD_FAILURE() << "moe_router_forward accepted " << E << " experts";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("moe_router_forward"), std::string::npos) << what;
    EXPECT_NE(what.find("model.n_experts"), std::string::npos) << what;
  }
}

// No atomics: two runs of each routing op on the GPU give the same bits (the largest row shapes).
TEST(BackendOpsMoe, CudaRoutingIsBitwiseRepeatable) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  std::vector<OpCase> cases = all_cases();
  for (const std::string name : {"moe_router_forward_E128_k8_renorm_bias", "moe_router_backward_E128_k8_renorm",
                                 "moe_combine_k8_C130", "moe_combine_backward_k8_C130"}) {
    auto c = std::find_if(cases.begin(), cases.end(), [&](const OpCase& o) { return o.name == name; });
    ASSERT_NE(c, cases.end()) << name;
    const std::vector<Output> a = c->run(cuda_backend()), b = c->run(cuda_backend());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].values, b[i].values) << name << ": output " << a[i].name;
  }
}

// CUDA's multi-tensor AdamW (adamw_step_many) against its per-tensor kernel (adamw_step on each), bit for bit: the
// same per-element function. 43 tensors: more than a launch's 36, one of 320 chunks of 65536 elements and 3 more (past
// a launch's 320 blocks: its last chunks go to the next launch), one of a chunk exactly; with and without the bf16
// working copy; two steps.
TEST(BackendOpsAdamW, CudaManyEqualsEachTensorsStepBitwise) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  Backend& be = cuda_backend();
  std::vector<Shape> shapes;
  for (int64_t i = 0; i < 41; ++i) shapes.push_back({1 + (i * 97) % 1000});
  shapes.insert(shapes.begin() + 20, Shape{320 * 65536 + 3});
  shapes.insert(shapes.begin() + 5, Shape{65536});
  for (bool with_work : {false, true}) {
    struct State {
      std::vector<Tensor> p, m, v, work;
    } many, each;
    for (State* st : {&many, &each})
      for (size_t i = 0; i < shapes.size(); ++i) {
        st->p.push_back(input(be, shapes[i], 500 + i));
        st->m.emplace_back(be, shapes[i]);
        st->v.emplace_back(be, shapes[i]);
        be.fill(st->m.back(), 0.0f);
        be.fill(st->v.back(), 0.0f);
        st->work.push_back(with_work ? Tensor(be, shapes[i], DType::bf16) : Tensor());
      }
    for (int64_t step = 1; step <= 2; ++step) {
      const AdamWArgs args{1e-3, 0.9, 0.95, 1e-8, 0.1, step};
      std::vector<Tensor> g;  // (each tensor's shape) this step's gradients, the same for both
      for (size_t i = 0; i < shapes.size(); ++i) g.push_back(input(be, shapes[i], 700 + 64 * step + i, -0.1, 0.1));
      std::vector<Backend::AdamWSlot> slots;
      for (size_t i = 0; i < shapes.size(); ++i)
        slots.push_back({&many.p[i], &g[i], &many.m[i], &many.v[i], &many.work[i]});
      be.adamw_step_many(slots, args);
      for (size_t i = 0; i < shapes.size(); ++i)
        be.adamw_step(each.p[i], g[i], each.m[i], each.v[i], args, each.work[i]);
    }
    // The first element that differs (its index and both values), or none.
    auto first_difference = [&](const Tensor& a, const Tensor& b) -> std::string {
      const std::vector<double> x = out(be, "", a).values, y = out(be, "", b).values;
      for (size_t j = 0; j < x.size(); ++j)
        if (std::memcmp(&x[j], &y[j], sizeof(double)) != 0)
          return cat("element ", j, ": many ", x[j], ", each ", y[j]);
      return "";
    };
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string at =
          cat("tensor ", i, " ", shape_str(shapes[i]), with_work ? " with the bf16 working copy" : "");
      EXPECT_EQ(first_difference(many.p[i], each.p[i]), "") << "param of " << at;
      EXPECT_EQ(first_difference(many.m[i], each.m[i]), "") << "exp_avg of " << at;
      EXPECT_EQ(first_difference(many.v[i], each.v[i]), "") << "exp_avg_sq of " << at;
      if (with_work) EXPECT_EQ(first_difference(many.work[i], each.work[i]), "") << "work of " << at;
    }
  }
}

// --- Llama's ops on the CPU against references written here -----------------------------------------
// float32 CPU kernels against the formulas in double (RMSNorm, SwiGLU, rotary embeddings), and grouped-query
// attention against the reference attention_forward / attention_backward with each key/value head repeated
// for its query heads (dK, dV: sums over the group's heads).

std::vector<double> values(const Tensor& t) { return out(cpu_backend(), "", t).values; }
Output named(const std::string& name, std::vector<double> v) { return Output{name, std::move(v)}; }

// The backend's checks build their messages only on failure (Check::that takes a callable): a failing check still
// names the op, the columns and both shapes, and ends the process with exit 1.
TEST(BackendChecks, FailedCheckNamesTheOpAndShapes) {
  Backend& be = cpu_backend();
  Tensor src(be, {4, 8}), dst(be, {4, 6});
  EXPECT_EXIT(be.copy_columns(src, 0, dst, 0, 9), ::testing::ExitedWithCode(1),
              "copy_columns: columns \\[0, 9\\) of src \\[4, 8\\] into \\[0, 9\\) of dst \\[4, 6\\]");
  Tensor x(be, {3, 2 * 12}), pe(be, {3, 2 * 8});
  EXPECT_EXIT(be.gather_rotary(x, 12, 6, true, pe), ::testing::ExitedWithCode(1),
              "gather_rotary: pe \\[3, 16\\] must be \\(n, 2 heads \\* dr\\) with columns \\[6, 6 \\+ dr\\)");
}

TEST(LlamaOpsCpu, RmsNormMatchesDoubleReference) {
  Backend& be = cpu_backend();
  for (Shape s : {Shape{3, 7}, Shape{127, 513}}) {
    const int64_t n = s[0], d = s[1];
    const float eps = 1e-5f;
    Tensor x = input(be, s, 150, -1, 3), gamma = input(be, {d}, 151, 0.5, 1.5), dy = input(be, s, 152);
    Tensor y(be, s), rstd(be, {n}), dx(be, s), dgamma = input(be, {d}, 153);
    const std::vector<double> dgamma0 = values(dgamma);
    be.rmsnorm_forward(x, gamma, eps, y, rstd);
    be.rmsnorm_backward_input(dy, x, gamma, rstd, dx);
    be.rmsnorm_backward_weight(dy, x, rstd, dgamma);
    const std::vector<double> X = values(x), G = values(gamma), DY = values(dy);
    std::vector<double> Y(X.size()), R(static_cast<size_t>(n)), DX(X.size()), DG = dgamma0;
    for (int64_t r = 0; r < n; ++r) {
      double ss = 0, sgx = 0;
      for (int64_t i = 0; i < d; ++i) ss += X[size_t(r * d + i)] * X[size_t(r * d + i)];
      const double rs = 1.0 / std::sqrt(ss / double(d) + double(eps));
      R[size_t(r)] = rs;
      for (int64_t i = 0; i < d; ++i) {
        const size_t at = size_t(r * d + i);
        Y[at] = X[at] * rs * G[size_t(i)];
        sgx += DY[at] * G[size_t(i)] * X[at];
        DG[size_t(i)] += DY[at] * X[at] * rs;
      }
      for (int64_t i = 0; i < d; ++i) {
        const size_t at = size_t(r * d + i);
        DX[at] = rs * G[size_t(i)] * DY[at] - X[at] * rs * rs * rs * sgx / double(d);
      }
    }
    const std::string what = "rmsnorm " + dims(s) + ": ";
    expect_within(what + "y", named("y", Y), out(be, "y", y), 1e-6, "double", "cpu");
    expect_within(what + "rstd", named("rstd", R), out(be, "rstd", rstd), 1e-6, "double", "cpu");
    expect_within(what + "dx", named("dx", DX), out(be, "dx", dx), 1e-6, "double", "cpu");
    expect_within(what + "dgamma", named("dgamma", DG), out(be, "dgamma", dgamma), 1e-6, "double", "cpu");
  }
}

TEST(LlamaOpsCpu, SwiGluMatchesDoubleReference) {
  Backend& be = cpu_backend();
  const Shape s{37, 129};
  Tensor gate = input(be, s, 154, -12, 12), up = input(be, s, 155), dh = input(be, s, 156);
  Tensor h(be, s), dgate(be, s), dup(be, s);
  be.swiglu_forward(gate, up, h);
  be.swiglu_backward(dh, gate, up, dgate, dup);
  const std::vector<double> Gt = values(gate), U = values(up), D = values(dh);
  std::vector<double> H(Gt.size()), DG(Gt.size()), DU(Gt.size());
  for (size_t i = 0; i < Gt.size(); ++i) {
    const double sg = 1.0 / (1.0 + std::exp(-Gt[i]));
    H[i] = Gt[i] * sg * U[i];
    DG[i] = D[i] * U[i] * sg * (1.0 + Gt[i] * (1.0 - sg));
    DU[i] = D[i] * Gt[i] * sg;
  }
  expect_within("swiglu h", named("h", H), out(be, "h", h), 1e-6, "double", "cpu");
  expect_within("swiglu dgate", named("dgate", DG), out(be, "dgate", dgate), 1e-6, "double", "cpu");
  expect_within("swiglu dup", named("dup", DU), out(be, "dup", dup), 1e-6, "double", "cpu");
  // In place (dgate over gate, dup over up): the same bits.
  be.swiglu_backward(dh, gate, up, gate, up);
  EXPECT_EQ(values(gate), values(dgate));
  EXPECT_EQ(values(up), values(dup));
}

TEST(LlamaOpsCpu, RopeMatchesFormulaAndItsInverseRestoresX) {
  Backend& be = cpu_backend();
  for (int64_t hd : {int64_t(16), int64_t(64)}) {
    const int64_t T = 37, heads = 3, n = 2 * T, pos0 = 5, cols = heads * hd;
    const double theta = 10000.0;
    Tensor x = input(be, {n, cols}, 157, -2, 2), y(be, {n, cols});
    be.rope(x, T, hd, theta, pos0, false, y);
    const std::vector<double> X = values(x);
    std::vector<double> Y(X.size());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < hd / 2; ++i) {
        // transformers' LlamaRotaryEmbedding: inv_freq and the angle in float32
        const float inv_freq = 1.0f / powf(float(theta), float(2 * i) / float(hd));
        const float a = float(pos0 + r % T) * inv_freq;
        const double c = std::cos(double(a)), sn = std::sin(double(a));
        for (int64_t h = 0; h < heads; ++h) {
          const size_t lo = size_t(r * cols + h * hd + i), hi = lo + size_t(hd / 2);
          Y[lo] = X[lo] * c - X[hi] * sn;
          Y[hi] = X[hi] * c + X[lo] * sn;
        }
      }
    const std::string what = "rope hd " + std::to_string(hd) + ": ";
    expect_within(what + "y", named("y", Y), out(be, "y", y), 1e-6, "double", "cpu");
    be.rope(y, T, hd, theta, pos0, true, y);  // in place
    expect_within(what + "inverse(rope(x))", named("x", X), out(be, "x", y), 1e-6, "x", "inverse");
  }
}

// q (rows, H*hd), k, v (rows, KV*hd) -> the packed (rows, 3*H*hd) of the reference attention, each key/value
// head repeated for its H/KV query heads.
Tensor repeat_kv_packed(const Tensor& q, const Tensor& k, const Tensor& v, int64_t H, int64_t KV) {
  const int64_t rows = q.size(0), hd = q.size(1) / H, C = H * hd, Ckv = KV * hd;
  const std::vector<double> Q = values(q), K = values(k), V = values(v);
  std::vector<float> qkv(size_t(rows * 3 * C));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < hd; ++i) {
        const size_t at = size_t(r * 3 * C + h * hd + i), kv = size_t(r * Ckv + (h / (H / KV)) * hd + i);
        qkv[at] = float(Q[size_t(r * C + h * hd + i)]);
        qkv[at + size_t(C)] = float(K[kv]);
        qkv[at + size_t(2 * C)] = float(V[kv]);
      }
  Tensor t(cpu_backend(), {rows, 3 * C});
  cpu_backend().upload(t, qkv.data());
  return t;
}

struct GqaShape { int64_t B, T, H, KV, hd; };
std::string gqa_name(const GqaShape& g) {
  return "B" + std::to_string(g.B) + " T" + std::to_string(g.T) + " H" + std::to_string(g.H) + " KV" +
         std::to_string(g.KV) + " hd" + std::to_string(g.hd);
}
const std::vector<GqaShape> kGqaShapes = {{2, 37, 4, 4, 16}, {2, 37, 4, 2, 16}, {2, 37, 4, 1, 16},
                                          {1, 130, 4, 4, 64}, {1, 130, 4, 2, 64}, {2, 130, 4, 1, 64}};

TEST(LlamaOpsCpu, GqaFlashAttentionMatchesReferenceWithRepeatedHeads) {
  Backend& be = cpu_backend();
  for (const GqaShape& g : kGqaShapes) {
    const int64_t n = g.B * g.T, C = g.H * g.hd, Ckv = g.KV * g.hd, group = g.H / g.KV;
    Tensor q = input(be, {n, C}, 160, -2, 2), k = input(be, {n, Ckv}, 161, -2, 2), v = input(be, {n, Ckv}, 162, -2, 2);
    Tensor dy = input(be, {n, C}, 163), y(be, {n, C}), lse(be, {g.B, g.H, g.T});
    Tensor dq(be, {n, C}), dk(be, {n, Ckv}), dv(be, {n, Ckv});
    be.flash_attention_gqa_forward(q, k, v, g.B, g.T, g.H, g.KV, y, lse);
    be.flash_attention_gqa_backward(dy, q, k, v, y, lse, g.B, g.T, g.H, g.KV, dq, dk, dv);

    Tensor qkv = repeat_kv_packed(q, k, v, g.H, g.KV), att(be, {g.B, g.H, g.T, g.T}), y_ref(be, {n, C});
    Tensor dqkv(be, {n, 3 * C});
    be.attention_forward(qkv, g.B, g.T, g.H, att, y_ref);
    be.attention_backward(dy, qkv, att, g.B, g.T, g.H, dqkv);
    const std::vector<double> D = values(dqkv);
    std::vector<double> DQ(size_t(n * C)), DK(size_t(n * Ckv), 0.0), DV(DK.size(), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t i = 0; i < g.hd; ++i) {
          const size_t at = size_t(r * 3 * C + h * g.hd + i), kv = size_t(r * Ckv + (h / group) * g.hd + i);
          DQ[size_t(r * C + h * g.hd + i)] = D[at];
          DK[kv] += D[at + size_t(C)];
          DV[kv] += D[at + size_t(2 * C)];
        }
    const std::string what = "gqa " + gqa_name(g) + ": ";
    expect_within(what + "out", out(be, "out", y_ref), out(be, "out", y), kTolFlash, "reference", "flash");
    expect_within(what + "dq", named("dq", DQ), out(be, "dq", dq), kTolFlash, "reference", "flash");
    expect_within(what + "dk", named("dk", DK), out(be, "dk", dk), kTolFlash, "reference", "flash");
    expect_within(what + "dv", named("dv", DV), out(be, "dv", dv), kTolFlash, "reference", "flash");
  }
}

// Decoding B sequences position after position gives the full causal attention's row at each position.
TEST(LlamaOpsCpu, GqaDecodeMatchesFullAttention) {
  Backend& be = cpu_backend();
  for (GqaShape g : kGqaShapes) {
    g.T = std::min<int64_t>(g.T, 40);
    const int64_t n = g.B * g.T, C = g.H * g.hd, Ckv = g.KV * g.hd;
    Tensor q = input(be, {n, C}, 164, -2, 2), k = input(be, {n, Ckv}, 165, -2, 2), v = input(be, {n, Ckv}, 166, -2, 2);
    Tensor qkv = repeat_kv_packed(q, k, v, g.H, g.KV), att(be, {g.B, g.H, g.T, g.T}), y_ref(be, {n, C});
    be.attention_forward(qkv, g.B, g.T, g.H, att, y_ref);
    const std::vector<double> Q = values(q), K = values(k), V = values(v), REF = values(y_ref);
    Tensor kc(be, {g.B, g.T, Ckv}), vc(be, {g.B, g.T, Ckv}), qt(be, {g.B, C}), kt(be, {g.B, Ckv}), vt(be, {g.B, Ckv});
    Tensor ot(be, {g.B, C});
    std::vector<double> got(size_t(n * C)), want(got.size());
    for (int64_t t = 0; t < g.T; ++t) {
      // rows t of each sequence, gathered
      auto gather = [&](const std::vector<double>& src, int64_t cols, Tensor& dst) {
        std::vector<float> rows(size_t(g.B * cols));
        for (int64_t b = 0; b < g.B; ++b)
          for (int64_t c = 0; c < cols; ++c) rows[size_t(b * cols + c)] = float(src[size_t((b * g.T + t) * cols + c)]);
        be.upload(dst, rows.data());
      };
      gather(Q, C, qt), gather(K, Ckv, kt), gather(V, Ckv, vt);
      be.attention_decode_gqa(qt, kt, vt, kc, vc, t, g.H, g.KV, ot);
      const std::vector<double> o = values(ot);
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t c = 0; c < C; ++c) {
          got[size_t((b * g.T + t) * C + c)] = o[size_t(b * C + c)];
          want[size_t((b * g.T + t) * C + c)] = REF[size_t((b * g.T + t) * C + c)];
        }
    }
    expect_within("decode " + gqa_name(g), named("out", want), named("out", got), kTolAttention, "full", "decode");
    // the caches hold k and v, sequence-major
    std::vector<double> kcache_want(size_t(n * Ckv));
    for (size_t i = 0; i < kcache_want.size(); ++i) kcache_want[i] = K[i];
    expect_within("decode kcache " + gqa_name(g), named("k", kcache_want), out(be, "k", kc), kTolExact, "k", "kcache");
  }
}

// Multi-head latent attention's absorbed decode (attention_decode_latent): position after position, each head's
// softmax over the cached [latent | rotary key] rows times the cached latents, against the formula in double; the
// cache holds the rows it was given, sequence-major. CPU only (the CUDA backend refuses the op).
TEST(MlaOpsCpu, LatentDecodeMatchesTheFormula) {
  Backend& be = cpu_backend();
  const int64_t B = 2, T = 9, H = 3, r = 12, dr = 4, dk = r + dr;
  const float scale = 0.37f;
  Tensor cache(be, {B, T, dk}), qt(be, {B, H * dk}), kvt(be, {B, dk}), ot(be, {B, H * r});
  std::vector<double> kv_all(size_t(B * T * dk)), got(size_t(B * T * H * r)), want(got.size());
  for (int64_t t = 0; t < T; ++t) {
    Tensor q = input(be, {B, H * dk}, 300 + uint64_t(t), -2, 2), kv = input(be, {B, dk}, 400 + uint64_t(t), -2, 2);
    be.copy(qt, q);
    be.copy(kvt, kv);
    const std::vector<double> Q = values(q), KV = values(kv);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < dk; ++c) kv_all[size_t((b * T + t) * dk + c)] = KV[size_t(b * dk + c)];
    be.attention_decode_latent(qt, kvt, cache, t, H, scale, ot);
    const std::vector<double> O = values(ot);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> p(size_t(t + 1));
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t c = 0; c < dk; ++c) dot += Q[size_t(b * H * dk + h * dk + c)] * kv_all[size_t((b * T + s) * dk + c)];
          mx = std::max(mx, p[size_t(s)] = scale * dot);
        }
        for (auto& v : p) sum += (v = std::exp(v - mx));
        for (int64_t c = 0; c < r; ++c) {
          double o = 0;
          for (int64_t s = 0; s <= t; ++s) o += p[size_t(s)] / sum * kv_all[size_t((b * T + s) * dk + c)];
          const size_t at = size_t(((b * T + t) * H + h) * r + c);
          want[at] = o;
          got[at] = O[size_t(b * H * r + h * r + c)];
        }
      }
  }
  expect_within("latent decode", named("out", want), named("out", got), kTolAttention, "formula", "decode");
  expect_within("latent decode cache", named("cache", kv_all), out(be, "cache", cache), kTolExact, "kv", "cache");
}

// The same decode in bf16 (the cache, queries and output stored in bf16; math in float) against fp32 on the same
// bf16-representable inputs: within kBf16TwoStages of the output's scale (the output rounded once, the latents re-read
// from a bf16 cache). Skipped where oneDNN's bf16 is unavailable, as Bf16Ops.
TEST(MlaOpsCpu, LatentDecodeBf16MatchesFp32) {
  Backend& be = cpu_backend();
  try {
    be.set_precision(Precision::bf16);
  } catch (const relay::Error& e) {
    be.set_precision(Precision::fp32);
    GTEST_SKIP() << e.what();
  }
  const int64_t B = 2, T = 9, H = 3, r = 12, dr = 4, dk = r + dr;
  auto run = [&](DType dt) {
    Tensor cache(be, {B, T, dk}, dt), o(be, {T, B * H * r}, dt);
    for (int64_t t = 0; t < T; ++t) {
      Tensor q = input(be, {B, H * dk}, 500 + uint64_t(t), dt, -2, 2), kv = input(be, {B, dk}, 600 + uint64_t(t), dt, -2, 2);
      Tensor ot = o.rows(t, 1).view({B, H * r});
      be.attention_decode_latent(q, kv, cache, t, H, 0.37f, ot);
    }
    return out(be, "out", o);
  };
  g_bf16_representable_inputs = true;
  const Output want = run(DType::f32);
  g_bf16_representable_inputs = false;
  const Output got = run(DType::bf16);
  be.set_precision(Precision::fp32);
  expect_within("latent decode bf16", want, got, kBf16TwoStages, "fp32", "bf16");
}

// --- a small MLP: forward, backward and one SGD step, at the backend-op level -----------------
// x (n, in) -> linear1 -> gelu -> layernorm -> linear2 -> cross-entropy, weights (out, in) as torch.
// dt is the activations' and working weights' dtype: with bf16, the float32 masters are converted to
// bf16 working copies, weight gradients and statistics stay float32, and the SGD step writes the new
// working copies (mixed precision as the trainer runs it).

std::vector<Output> mlp_step(Backend& be, DType dt) {
  const int64_t n = 64, in = 37, hidden = 129, classes = 10;
  const float grad_scale = 1.0f / static_cast<float>(n);
  Tensor x = input(be, {n, in}, 90, dt), targets = class_targets(be, n, classes, 91);
  // float32 masters
  Tensor w1 = input(be, {hidden, in}, 92, -0.3, 0.3), b1 = input(be, {hidden}, 93, -0.1, 0.1);
  Tensor gamma = input(be, {hidden}, 94, 0.8, 1.2), beta = input(be, {hidden}, 95, -0.1, 0.1);
  Tensor w2 = input(be, {classes, hidden}, 96, -0.3, 0.3), b2 = input(be, {classes}, 97, -0.1, 0.1);
  // working copies: the masters themselves in fp32, bf16 copies otherwise
  auto working = [&](const Tensor& master) {
    if (dt == DType::f32) return master;
    Tensor w(be, master.shape(), dt);
    be.convert(master, w);
    return w;
  };
  Tensor w1x = working(w1), b1x = working(b1), gammax = working(gamma), betax = working(beta);
  Tensor w2x = working(w2), b2x = working(b2);

  // forward
  Tensor h(be, {n, hidden}, dt), a(be, {n, hidden}, dt), z(be, {n, hidden}, dt), logits(be, {n, classes}, dt);
  Tensor mean(be, {n}), rstd(be, {n}), losses(be, {n}), dlogits(be, {n, classes}, dt);
  be.matmul(x, false, w1x, true, h, 1.0f, 0.0f);  // (n, hidden)
  be.add_bias(h, b1x);
  be.activation_forward(Activation::gelu, h, a);
  be.layernorm_forward(a, gammax, betax, 1e-5f, z, mean, rstd);
  be.matmul(z, false, w2x, true, logits, 1.0f, 0.0f);  // (n, classes)
  be.add_bias(logits, b2x);
  be.cross_entropy(logits, targets, grad_scale, losses, &dlogits);

  // backward: weight gradients float32 (a bf16 GEMM may write a float32 y)
  Tensor dw2(be, {classes, hidden}), db2(be, {classes}), dz(be, {n, hidden}, dt), da(be, {n, hidden}, dt);
  Tensor dgamma(be, {hidden}), dbeta(be, {hidden}), dw1(be, {hidden, in}), db1(be, {hidden}), dx(be, {n, in}, dt);
  be.matmul(dlogits, true, z, false, dw2, 1.0f, 0.0f);  // (classes, hidden)
  be.bias_grad(dlogits, db2, 0.0f);
  be.matmul(dlogits, false, w2x, false, dz, 1.0f, 0.0f);  // (n, hidden)
  be.fill(dgamma, 0.0f);
  be.fill(dbeta, 0.0f);
  be.layernorm_backward_weight(dz, a, mean, rstd, dgamma, dbeta);
  be.layernorm_backward_input(dz, a, gammax, mean, rstd, da);
  be.activation_backward(Activation::gelu, h, da, da);  // in place, as layers do
  be.matmul(da, true, x, false, dw1, 1.0f, 0.0f);        // (hidden, in)
  be.bias_grad(da, db1, 0.0f);
  be.matmul(da, false, w1x, false, dx, 1.0f, 0.0f);      // (n, in)

  // update the masters (and, in bf16, their working copies in the same pass)
  Tensor none;
  for (auto [p, g, wx] : {std::tuple{&w1, &dw1, &w1x}, {&b1, &db1, &b1x}, {&w2, &dw2, &w2x}, {&b2, &db2, &b2x},
                          {&gamma, &dgamma, &gammax}, {&beta, &dbeta, &betax}})
    be.sgd_step(*p, *g, none, SgdArgs{0.1, 0.0, 0.0, true}, dt == DType::bf16 ? *wx : none);
  const double grad_norm2 = be.sum_squares(dw1) + be.sum_squares(dw2);

  std::vector<Output> o{out(be, "losses", losses), out(be, "logits", logits), out(be, "dx", dx), out(be, "dw1", dw1),
                        out(be, "db1", db1), out(be, "dgamma", dgamma), out(be, "dbeta", dbeta), out(be, "dw2", dw2),
                        out(be, "db2", db2), out(be, "w1_after_step", w1), out(be, "w2_after_step", w2),
                        Output{"grad_norm2", {grad_norm2}}};
  if (dt == DType::bf16) o.push_back(out(be, "w1_work_after_step", w1x));
  return o;
}

TEST(BackendOpsMlp, ForwardBackwardStepMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << kNoCuda;
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string name = dt == DType::f32 ? "mlp_fp32" : "mlp_bf16";
    std::string why;
    if (!set_precisions(dt == DType::bf16 ? Precision::bf16 : Precision::fp32, why)) {
      std::cout << "[  SKIPPED ] " << name << ": " << why << "\n";
      continue;
    }
    std::vector<Output> ref = mlp_step(cpu_backend(), dt);
    std::vector<Output> got = mlp_step(cuda_backend(), dt);
    set_precisions(Precision::fp32, why);
    ASSERT_EQ(ref.size(), got.size());
    for (size_t i = 0; i < ref.size(); ++i)
      expect_close(name, ref[i], got[i], dt == DType::f32 ? kTolMlp : kTolMlpBf16, 0.0);
  }
}

}  // namespace
}  // namespace relay
