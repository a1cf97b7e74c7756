// FlashAttention-2 CPU kernels (kernels/cpu/flash_attention.cpp) against the reference kernels that store
// the (B, H, T, T) probabilities (attention_forward / attention_backward in kernels/cpu/transformer.cpp,
// themselves checked against double precision and central differences in test_transformer_kernels):
// float32 and bfloat16 storage, shapes that do and do not fill the tiles, and bitwise independence of the
// thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/attention_merge.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/flash_attention.hpp"

using namespace relay;

namespace {

struct Shape {
  int64_t B, T, C, H;
};

// T below, at and past the kernels' 128-row tiles and not a multiple of them; hd = C / H in {8, 16, 64}.
const Shape kShapes[] = {{1, 1, 8, 1},    {2, 7, 32, 2},    {3, 65, 64, 4},  {1, 200, 128, 2},
                         {2, 129, 32, 4}, {1, 256, 256, 4}, {2, 300, 64, 1}, {3, 130, 192, 3}};

std::vector<float> randn(size_t n, uint64_t stream, float scale) {
  Rng r(11, stream);
  std::vector<float> v(n);
  for (auto& x : v) x = float(r.normal()) * scale;
  return v;
}

std::vector<float> rounded_to_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
  return r;
}
std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(v[i]);
  return r;
}

// Columns [c0, c0 + width) of every row of x (rows, ld): one output of the kernels (out, dq, dk or dv).
std::vector<float> columns(const std::vector<float>& x, int64_t ld, int64_t c0, int64_t width) {
  std::vector<float> r;
  for (size_t row = 0; row < x.size() / size_t(ld); ++row)
    for (int64_t c = c0; c < c0 + width; ++c) r.push_back(x[row * size_t(ld) + size_t(c)]);
  return r;
}

// max |a - b| / max(max |ref|, 1): the error relative to the output's own magnitude. The inputs are O(1),
// so an output that vanishes (dq and dk at T = 1, where the softmax has one entry) is held to the same
// figure in absolute terms. NaN anywhere gives infinity.
double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(ref[i]));
    if (!(d == d)) return std::numeric_limits<double>::infinity();
    err = std::max(err, d);
    mag = std::max(mag, std::fabs(double(ref[i])));
  }
  return err / std::max(mag, 1.0);
}

struct Reference {
  std::vector<float> out, dqkv;
  std::vector<double> lse;  // (B, H, T) log sum_s exp(q_t . k_s / sqrt(hd)), in double
};

Reference reference(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int64_t hd = s.C / s.H;
  Reference r;
  std::vector<float> att(size_t(s.B * s.H * s.T * s.T));  // (B, H, T, T)
  r.out.resize(size_t(s.B * s.T * s.C));
  r.dqkv.assign(qkv.size(), 0.0f);
  cpu::attention_forward(qkv.data(), att.data(), r.out.data(), s.B, s.T, s.C, s.H);
  cpu::attention_backward(dout.data(), qkv.data(), att.data(), r.dqkv.data(), s.B, s.T, s.C, s.H);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        std::vector<double> z;
        for (int64_t k = 0; k <= t; ++k) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i)
            dot += double(qkv[size_t((b * s.T + t) * 3 * s.C + h * hd + i)]) *
                   double(qkv[size_t((b * s.T + k) * 3 * s.C + s.C + h * hd + i)]);
          z.push_back(dot / std::sqrt(double(hd)));
        }
        const double mx = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (double x : z) sum += std::exp(x - mx);
        r.lse.push_back(mx + std::log(sum));
      }
  return r;
}

template <typename Elem>
struct Flash {
  std::vector<Elem> out, dqkv;
  std::vector<float> lse;
};

template <typename Elem>
Flash<Elem> flash(const Shape& s, const std::vector<Elem>& qkv, const std::vector<Elem>& dout) {
  Flash<Elem> f;
  f.out.resize(size_t(s.B * s.T * s.C));
  f.lse.resize(size_t(s.B * s.H * s.T));
  cpu::flash_attention_forward(qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.C, s.H);
  // Garbage in dqkv: the backward must overwrite, not accumulate.
  Elem garbage;
  store(garbage, std::numeric_limits<float>::quiet_NaN());
  f.dqkv.assign(qkv.size(), garbage);
  cpu::flash_attention_backward(dout.data(), qkv.data(), f.out.data(), f.lse.data(), f.dqkv.data(), s.B, s.T, s.C,
                                s.H);
  return f;
}

std::string name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " H=" + std::to_string(s.H);
}

// Each output's error against the reference: out, then dq, dk, dv.
std::vector<double> errors(const Shape& s, const std::vector<float>& out, const std::vector<float>& dqkv,
                           const Reference& ref) {
  std::vector<double> e{relative_error(out, ref.out)};
  for (int64_t part = 0; part < 3; ++part)
    e.push_back(relative_error(columns(dqkv, 3 * s.C, part * s.C, s.C), columns(ref.dqkv, 3 * s.C, part * s.C, s.C)));
  return e;
}

class FlashAttention : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_threads(2); }
  void TearDown() override { cpu::set_threads(2); }
};

}  // namespace

// Scores of std ~1 (input scale 1) and ~6 (scale 2.5: near one-hot rows whose running max moves across
// key tiles, which exercises the online rescaling). Both sides are float32 with different summation orders
// and exp: a few ulps of each output's magnitude, which grow with the scores' (up to ~35 at scale 2.5,
// whose float32 rounding moves a probability by ~2e-6): 1e-5.
TEST_F(FlashAttention, Float32MatchesTheReference) {
  const char* what[] = {"out", "dq", "dk", "dv"};
  for (float input_scale : {1.0f, 2.5f})
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(name(s) + " input scale " + std::to_string(input_scale));
      const auto qkv = randn(size_t(s.B * s.T * 3 * s.C), 1, input_scale);
      const auto dout = randn(size_t(s.B * s.T * s.C), 2, 1.0f);
      const Reference ref = reference(s, qkv, dout);
      const auto f = flash<float>(s, qkv, dout);
      const auto e = errors(s, f.out, f.dqkv, ref);
      for (size_t i = 0; i < e.size(); ++i) EXPECT_LE(e[i], 1e-5) << what[i];
      // lse against the double log-sum-exp; its float32 rounding alone is 6e-8 relative.
      for (size_t i = 0; i < ref.lse.size(); ++i)
        ASSERT_NEAR(f.lse[i], ref.lse[i], 2e-6 * std::max(1.0, std::fabs(ref.lse[i]))) << "row " << i;
    }
}

// bf16 storage on bf16 inputs against the float32 reference on the same values. The outputs are rounded
// to bf16 (relative error up to 2^-9 = 0.2%), and the backward reads the rounded out (through D = rowsum
// (dO * O)), so dq and dk inherit errors of that order from the softmax's cancellation: 1e-2 of the output's
// magnitude.
TEST_F(FlashAttention, Bfloat16MatchesTheReferenceWithinBf16Rounding) {
  const char* what[] = {"out", "dq", "dk", "dv"};
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(name(s));
    const auto qkv = rounded_to_bf16(randn(size_t(s.B * s.T * 3 * s.C), 3, 1.0f));
    const auto dout = rounded_to_bf16(randn(size_t(s.B * s.T * s.C), 4, 1.0f));
    const Reference ref = reference(s, qkv, dout);
    const auto f = flash<bf16>(s, to_bf16(qkv), to_bf16(dout));
    const auto e = errors(s, to_f32(f.out), to_f32(f.dqkv), ref);
    for (size_t i = 0; i < e.size(); ++i) EXPECT_LE(e[i], 1e-2) << what[i];
    for (size_t i = 0; i < ref.lse.size(); ++i)  // lse is float32 and sees exact bf16 inputs
      ASSERT_NEAR(f.lse[i], ref.lse[i], 2e-6 * std::max(1.0, std::fabs(ref.lse[i]))) << "row " << i;
  }
}

// The bf16 kernels widen to float32 and run the float32 kernels' arithmetic: on bf16 inputs their results
// are the float32 kernels' results rounded to bf16, bit for bit (the backward given the same rounded out).
TEST_F(FlashAttention, Bfloat16IsTheFloat32ArithmeticRounded) {
  const Shape s{2, 200, 128, 2};
  const auto qkv = rounded_to_bf16(randn(size_t(s.B * s.T * 3 * s.C), 5, 1.0f));
  const auto dout = rounded_to_bf16(randn(size_t(s.B * s.T * s.C), 6, 1.0f));
  const auto fb = flash<bf16>(s, to_bf16(qkv), to_bf16(dout));
  std::vector<float> out(size_t(s.B * s.T * s.C)), lse(size_t(s.B * s.H * s.T)), dqkv(qkv.size());
  cpu::flash_attention_forward(qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.H);
  EXPECT_EQ(lse, fb.lse);
  EXPECT_EQ(rounded_to_bf16(out), to_f32(fb.out));
  const auto out_bf16 = to_f32(fb.out);
  cpu::flash_attention_backward(dout.data(), qkv.data(), out_bf16.data(), lse.data(), dqkv.data(), s.B, s.T, s.C, s.H);
  EXPECT_EQ(rounded_to_bf16(dqkv), to_f32(fb.dqkv));
}

TEST_F(FlashAttention, BitwiseIndependentOfThreadCount) {
  // B * H = 3 heads and 3 query blocks: uneven work for any thread count.
  const Shape s{3, 300, 64, 1};
  const auto qkv = randn(size_t(s.B * s.T * 3 * s.C), 7, 1.5f);
  const auto dout = randn(size_t(s.B * s.T * s.C), 8, 1.0f);
  const auto qkv16 = to_bf16(qkv), dout16 = to_bf16(dout);
  auto bits = [](const auto& v) {
    std::vector<uint16_t> r(v.size() * sizeof(v[0]) / 2);
    std::memcpy(r.data(), v.data(), r.size() * 2);
    return r;
  };
  cpu::set_threads(1);
  const auto f1 = flash<float>(s, qkv, dout);
  const auto b1 = flash<bf16>(s, qkv16, dout16);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    cpu::set_threads(threads);
    const auto f = flash<float>(s, qkv, dout);
    const auto b = flash<bf16>(s, qkv16, dout16);
    EXPECT_EQ(bits(f.out), bits(f1.out));
    EXPECT_EQ(bits(f.lse), bits(f1.lse));
    EXPECT_EQ(bits(f.dqkv), bits(f1.dqkv));
    EXPECT_EQ(bits(b.out), bits(b1.out));
    EXPECT_EQ(bits(b.lse), bits(b1.lse));
    EXPECT_EQ(bits(b.dqkv), bits(b1.dqkv));
  }
}

// Grouped-query attention (4 query heads on 2 and on 1 key/value heads): a key/value head's dK, dV sum its
// query heads in order on one thread, so every output is the same bits for any thread count.
TEST_F(FlashAttention, GroupedQueryBitwiseIndependentOfThreadCount) {
  const int64_t B = 2, T = 150, H = 4, hd = 16, C = H * hd;
  for (int64_t KV : {int64_t(2), int64_t(1)}) {
    SCOPED_TRACE("KV " + std::to_string(KV));
    const int64_t Ckv = KV * hd;
    const auto q = randn(size_t(B * T * C), 9, 1.5f), k = randn(size_t(B * T * Ckv), 10, 1.5f);
    const auto v = randn(size_t(B * T * Ckv), 11, 1.0f), dout = randn(size_t(B * T * C), 12, 1.0f);
    auto run = [&] {
      std::vector<float> out(q.size()), lse(size_t(B * H * T)), dq(q.size()), dk(k.size()), dv(v.size());
      cpu::flash_attention_gqa_forward(q.data(), k.data(), v.data(), C, Ckv, out.data(), lse.data(), B, T, H, KV, hd);
      cpu::flash_attention_gqa_backward(dout.data(), q.data(), k.data(), v.data(), C, Ckv, out.data(), lse.data(),
                                        dq.data(), dk.data(), dv.data(), B, T, H, KV, hd);
      return std::vector<std::vector<float>>{out, lse, dq, dk, dv};
    };
    cpu::set_threads(1);
    const auto one = run();
    for (int threads : {2, 3}) {
      cpu::set_threads(threads);
      const auto r = run();
      for (size_t i = 0; i < r.size(); ++i)
        EXPECT_EQ(0, std::memcmp(r[i].data(), one[i].data(), r[i].size() * sizeof(float)))
            << "output " << i << " differs with " << threads << " threads";
    }
  }
}

// Document masking (data.document_mask): a packed sequence's outputs, lse and gradients equal those of each
// document run alone as its own sequence. Documents of 1 row, a few rows, exactly a tile (128), across tile
// boundaries, and one sequence that is a single document (plain causal attention); grouped-query heads; float32,
// where both sides are the same kernel with the documents at other tile offsets, so other GEMM blockings and
// summation orders: 38 of the 75 compared outputs differ, by at most 1.6e-6 of their magnitude (a few ulps of the
// O(10) scores moving the probabilities); the bound is 4e-6. And the mask's thread-count independence bit for bit.
TEST_F(FlashAttention, DocumentMaskEqualsEachDocumentAlone) {
  const int64_t B = 3, T = 300, H = 4, KV = 2, hd = 16, C = H * hd, Ckv = KV * hd;
  const std::vector<std::vector<int64_t>> docs = {{1, 37, 128, 2, 132}, {300}, {150, 1, 1, 148}};  // lengths
  std::vector<int32_t> doc_start(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0;
    for (int64_t len : docs[size_t(b)]) {
      for (int64_t t = at; t < at + len; ++t) doc_start[size_t(b * T + t)] = int32_t(at);
      at += len;
    }
    ASSERT_EQ(at, T);
  }
  const auto q = randn(size_t(B * T * C), 21, 1.5f), k = randn(size_t(B * T * Ckv), 22, 1.5f);
  const auto v = randn(size_t(B * T * Ckv), 23, 1.0f), dout = randn(size_t(B * T * C), 24, 1.0f);
  auto run = [&](const float* qp, const float* kp, const float* vp, const float* dp, int64_t nb, int64_t nt,
                 const int32_t* ds) {
    const size_t nq = size_t(nb * nt * C), nkv = size_t(nb * nt * Ckv);
    std::vector<float> out(nq), lse(size_t(nb * H * nt)), dq(nq), dk(nkv), dv(nkv);
    cpu::flash_attention_gqa_forward(qp, kp, vp, C, Ckv, out.data(), lse.data(), nb, nt, H, KV, hd, ds);
    cpu::flash_attention_gqa_backward(dp, qp, kp, vp, C, Ckv, out.data(), lse.data(), dq.data(), dk.data(), dv.data(),
                                      nb, nt, H, KV, hd, ds);
    return std::vector<std::vector<float>>{out, lse, dq, dk, dv};
  };
  cpu::set_threads(1);
  const auto packed = run(q.data(), k.data(), v.data(), dout.data(), B, T, doc_start.data());
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0;
    for (int64_t len : docs[size_t(b)]) {
      SCOPED_TRACE("sequence " + std::to_string(b) + ", document at " + std::to_string(at) + " of " +
                   std::to_string(len) + " rows");
      const int64_t row0 = b * T + at;
      const auto alone = run(q.data() + row0 * C, k.data() + row0 * Ckv, v.data() + row0 * Ckv,
                             dout.data() + row0 * C, 1, len, nullptr);
      for (size_t o = 0; o < alone.size(); ++o) {
        // The packed run's rows of this document: (len, width) of out, dq, dk, dv; lse (H, len) of sequence b.
        std::vector<float> got;
        if (o == 1) {
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = at; t < at + len; ++t) got.push_back(packed[1][size_t((b * H + h) * T + t)]);
        } else {
          const int64_t w = o == 3 || o == 4 ? Ckv : C;
          got.assign(packed[o].begin() + row0 * w, packed[o].begin() + (row0 + len) * w);
        }
        EXPECT_LE(relative_error(got, alone[o]), 4e-6) << names[o];
      }
      at += len;
    }
  }
  for (int threads : {2, 3}) {
    cpu::set_threads(threads);
    const auto r = run(q.data(), k.data(), v.data(), dout.data(), B, T, doc_start.data());
    for (size_t i = 0; i < r.size(); ++i)
      EXPECT_EQ(0, std::memcmp(r[i].data(), packed[i].data(), r[i].size() * sizeof(float)))
          << names[i] << " differs with " << threads << " threads";
  }
}

// Grouped-query attention over whole sequences, the reference the context-parallel tests cut up: random q, k, v and
// output gradient (streams seed to seed + 3) of B sequences of T rows, with documents of `period + step * b` rows in
// sequence b (period 0: none; doc_start is then all 0 and the kernels get no mask), and the kernels' out, lse, dq, dk,
// dv.
struct WholeSequences {
  WholeSequences(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, uint64_t seed, int64_t period, int64_t step)
      : q(randn(size_t(B * T * H * hd), seed, 1.5f)), k(randn(size_t(B * T * KV * hd), seed + 1, 1.5f)),
        v(randn(size_t(B * T * KV * hd), seed + 2, 1.0f)), dout(randn(size_t(B * T * H * hd), seed + 3, 1.0f)),
        out(q.size()), lse(size_t(B * H * T)), dq(q.size()), dk(k.size()), dv(v.size()), doc_start(size_t(B * T)) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0, start = 0; t < T; ++t) {
        if (period > 0 && t > 0 && t % (period + step * b) == 0) start = t;
        doc_start[size_t(b * T + t)] = int32_t(start);
      }
    const int32_t* ds = period > 0 ? doc_start.data() : nullptr;
    const int64_t C = H * hd, Ckv = KV * hd;
    cpu::flash_attention_gqa_forward(q.data(), k.data(), v.data(), C, Ckv, out.data(), lse.data(), B, T, H, KV, hd, ds);
    cpu::flash_attention_gqa_backward(dout.data(), q.data(), k.data(), v.data(), C, Ckv, out.data(), lse.data(),
                                      dq.data(), dk.data(), dv.data(), B, T, H, KV, hd, ds);
  }
  std::vector<float> q, k, v, dout;   // (B T, H hd), (B T, KV hd) twice, (B T, H hd)
  std::vector<float> out, lse, dq, dk, dv;  // (B T, H hd), (B, H, T), then as q, k, v
  std::vector<int32_t> doc_start;     // (B T) each row's document start in its sequence
};

// Context parallelism's attention (flash_attention_gqa_*_at): each of cp ranks holds chunks i and 2cp-1-i of every
// sequence (2cp chunks of T / 2cp rows: the load-balanced causal layout) and attends to the whole sequence's keys.
// Each rank's out and lse equal the full run's rows at its positions, its dq equal theirs, and the dk, dv of all
// ranks summed equal the full run's; with and without a document mask, cp 2 and 4 (float32, other tile
// alignments: 4e-6 of each output's magnitude as above).
TEST_F(FlashAttention, ChunksAtPositionsEqualTheWholeSequence) {
  const int64_t B = 2, T = 256, H = 4, KV = 2, hd = 16, C = H * hd, Ckv = KV * hd;
  for (bool docs : {false, true}) {
    const WholeSequences w(B, T, H, KV, hd, 31, docs ? 37 : 0, 20);  // documents of 37 (57) rows
    const auto &q = w.q, &k = w.k, &v = w.v, &dout = w.dout, &out = w.out, &lse = w.lse, &dq = w.dq;
    const auto &dk = w.dk, &dv = w.dv;
    const auto& doc_start = w.doc_start;
    for (int64_t cp : {int64_t(2), int64_t(4)}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + (docs ? ", documents" : ""));
      const int64_t c = T / (2 * cp), Tq = 2 * c;
      std::vector<float> dk_sum(k.size(), 0.f), dv_sum(v.size(), 0.f);
      for (int64_t i = 0; i < cp; ++i) {
        // This rank's rows: per sequence chunk i then chunk 2cp - 1 - i, at their positions.
        std::vector<int32_t> pos, lo;
        std::vector<float> ql, dl, ol, ll;  // (B*Tq, C) queries and output gradients; the full run's out, lse
        for (int64_t b = 0; b < B; ++b)
          for (int64_t chunk : {i, 2 * cp - 1 - i})
            for (int64_t t = chunk * c; t < (chunk + 1) * c; ++t) {
              pos.push_back(int32_t(t));
              lo.push_back(doc_start[size_t(b * T + t)]);
              const size_t row = size_t(b * T + t);
              ql.insert(ql.end(), q.begin() + row * C, q.begin() + (row + 1) * C);
              dl.insert(dl.end(), dout.begin() + row * C, dout.begin() + (row + 1) * C);
            }
        std::vector<float> o(size_t(B * Tq * C)), l(size_t(B * H * Tq)), g(o.size()), gk(k.size()), gv(v.size());
        cpu::flash_attention_gqa_forward_at(ql.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(), B, Tq, T,
                                            pos.data(), H, KV, hd, docs ? lo.data() : nullptr);
        cpu::flash_attention_gqa_backward_at(dl.data(), ql.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(),
                                             g.data(), gk.data(), gv.data(), B, Tq, T, pos.data(), H, KV, hd,
                                             docs ? lo.data() : nullptr);
        std::vector<float> want_o, want_l, want_g;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t r = 0; r < Tq; ++r) {
            const size_t row = size_t(b * T + pos[size_t(b * Tq + r)]);
            want_o.insert(want_o.end(), out.begin() + row * C, out.begin() + (row + 1) * C);
            want_g.insert(want_g.end(), dq.begin() + row * C, dq.begin() + (row + 1) * C);
          }
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t r = 0; r < Tq; ++r) want_l.push_back(lse[size_t((b * H + h) * T + pos[size_t(b * Tq + r)])]);
        EXPECT_LE(relative_error(o, want_o), 4e-6) << "out of rank " << i;
        EXPECT_LE(relative_error(l, want_l), 4e-6) << "lse of rank " << i;
        EXPECT_LE(relative_error(g, want_g), 4e-6) << "dq of rank " << i;
        for (size_t e = 0; e < gk.size(); ++e) dk_sum[e] += gk[e], dv_sum[e] += gv[e];
      }
      EXPECT_LE(relative_error(dk_sum, dk), 4e-6) << "dk summed over the ranks";
      EXPECT_LE(relative_error(dv_sum, dv), 4e-6) << "dv summed over the ranks";
    }
  }
}

// Context parallelism with parallel.overlap (model/context_parallel.cpp): a rank's queries against its own rows (a
// causal sequence of their own) and against the other ranks' rows (in sequence order, at the positions the rank's
// queries reach there), merged by attention_merge, give the attention over all keys at once; the backward's two
// parts with the merged out and lse sum to the whole one's dq, and its key gradients summed over the ranks to dk, dv.
// With documents, rows whose document starts inside their own chunk see no remote key (and rank 0's first chunk
// never does): their lse there is -inf and the merge must keep them finite.
TEST_F(FlashAttention, OwnAndRemoteKeysMergedEqualAllKeysAtOnce) {
  const int64_t B = 2, T = 64, H = 4, KV = 2, hd = 16, C = H * hd, Ckv = KV * hd;
  for (bool docs : {false, true}) {
    const WholeSequences w(B, T, H, KV, hd, 41, docs ? 11 : 0, 6);  // documents of 11 (17) rows
    const auto &q = w.q, &k = w.k, &v = w.v, &dout = w.dout, &out = w.out, &lse = w.lse, &dq = w.dq;
    const auto &dk = w.dk, &dv = w.dv;
    const auto& doc_start = w.doc_start;
    for (int64_t cp : {int64_t(2), int64_t(4)}) {
      const int64_t c = T / (2 * cp), Tl = 2 * c, Tr = T - Tl;
      std::vector<float> dk_sum(k.size(), 0.f), dv_sum(v.size(), 0.f);
      int64_t rows_without_remote = 0;
      for (int64_t i = 0; i < cp; ++i) {
        SCOPED_TRACE("cp " + std::to_string(cp) + ", rank " + std::to_string(i) + (docs ? ", documents" : ""));
        auto own = [&](int64_t t) { return (t / c == i || t / c == 2 * cp - 1 - i); };
        auto own_before = [&](int64_t x) {
          return std::clamp<int64_t>(x - i * c, 0, c) + std::clamp<int64_t>(x - (2 * cp - 1 - i) * c, 0, c);
        };
        std::vector<int64_t> lpos, rpos_of;  // (B*Tl), (B*Tr): the sequence rows of the own and the remote rows
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t chunk : {i, 2 * cp - 1 - i})
            for (int64_t t = chunk * c; t < (chunk + 1) * c; ++t) lpos.push_back(b * T + t);
          for (int64_t t = 0; t < T; ++t)
            if (!own(t)) rpos_of.push_back(b * T + t);
        }
        auto rows_of = [](const std::vector<float>& x, int64_t w, const std::vector<int64_t>& rows) {
          std::vector<float> y;
          for (int64_t r : rows) y.insert(y.end(), x.begin() + r * w, x.begin() + (r + 1) * w);
          return y;
        };
        const auto ql = rows_of(q, C, lpos), dl = rows_of(dout, C, lpos);
        const auto kl = rows_of(k, Ckv, lpos), vl = rows_of(v, Ckv, lpos);
        const auto kr = rows_of(k, Ckv, rpos_of), vr = rows_of(v, Ckv, rpos_of);
        std::vector<int32_t> local_doc, remote_doc, remote_pos;  // (B*Tl) each
        for (int64_t r : lpos) {
          const int64_t t = r % T, d = doc_start[size_t(r)];
          local_doc.push_back(int32_t(own_before(d)));
          remote_doc.push_back(int32_t(d - own_before(d)));
          remote_pos.push_back(int32_t(t - own_before(t + 1)));
          if (remote_doc.back() > remote_pos.back()) ++rows_without_remote;
        }
        std::vector<float> o(ql.size()), l(size_t(B * H * Tl)), o2(ql.size()), l2(l.size());
        cpu::flash_attention_gqa_forward(ql.data(), kl.data(), vl.data(), C, Ckv, o.data(), l.data(), B, Tl, H, KV,
                                         hd, docs ? local_doc.data() : nullptr);
        cpu::flash_attention_gqa_forward_at(ql.data(), kr.data(), vr.data(), C, Ckv, o2.data(), l2.data(), B, Tl, Tr,
                                            remote_pos.data(), H, KV, hd, docs ? remote_doc.data() : nullptr);
        cpu::attention_merge(o.data(), l.data(), o2.data(), l2.data(), B, Tl, H, hd);
        std::vector<float> want_l;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t r = 0; r < Tl; ++r) want_l.push_back(lse[size_t((b * H + h) * T + lpos[size_t(b * Tl + r)] % T)]);
        EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); }));
        EXPECT_LE(relative_error(o, rows_of(out, C, lpos)), 4e-6) << "merged out";
        EXPECT_LE(relative_error(l, want_l), 4e-6) << "merged lse";
        std::vector<float> g(ql.size()), g2(ql.size()), gkl(kl.size()), gvl(vl.size()), gkr(kr.size()), gvr(vr.size());
        cpu::flash_attention_gqa_backward(dl.data(), ql.data(), kl.data(), vl.data(), C, Ckv, o.data(), l.data(),
                                          g.data(), gkl.data(), gvl.data(), B, Tl, H, KV, hd,
                                          docs ? local_doc.data() : nullptr);
        cpu::flash_attention_gqa_backward_at(dl.data(), ql.data(), kr.data(), vr.data(), C, Ckv, o.data(), l.data(),
                                             g2.data(), gkr.data(), gvr.data(), B, Tl, Tr, remote_pos.data(), H, KV,
                                             hd, docs ? remote_doc.data() : nullptr);
        for (size_t e = 0; e < g.size(); ++e) g[e] += g2[e];
        EXPECT_LE(relative_error(g, rows_of(dq, C, lpos)), 4e-6) << "dq, own plus remote part";
        for (size_t r = 0; r < lpos.size(); ++r)
          for (int64_t e = 0; e < Ckv; ++e) {
            dk_sum[size_t(lpos[r] * Ckv + e)] += gkl[r * size_t(Ckv) + size_t(e)];
            dv_sum[size_t(lpos[r] * Ckv + e)] += gvl[r * size_t(Ckv) + size_t(e)];
          }
        for (size_t r = 0; r < rpos_of.size(); ++r)
          for (int64_t e = 0; e < Ckv; ++e) {
            dk_sum[size_t(rpos_of[r] * Ckv + e)] += gkr[r * size_t(Ckv) + size_t(e)];
            dv_sum[size_t(rpos_of[r] * Ckv + e)] += gvr[r * size_t(Ckv) + size_t(e)];
          }
      }
      EXPECT_GT(rows_without_remote, 0) << "cp " << cp << ": some query sees no remote key";
      EXPECT_LE(relative_error(dk_sum, dk), 4e-6) << "cp " << cp << ": dk summed over the ranks and parts";
      EXPECT_LE(relative_error(dv_sum, dv), 4e-6) << "cp " << cp << ": dv summed over the ranks and parts";
    }
  }
}

// Context parallelism in bf16 (train.precision = "bf16"): the positioned kernels widen to float32 and run the
// float32 arithmetic, so on bf16 inputs their out, dq, dk and dv are the float32 kernels' rounded to bf16, bit for
// bit, and their lse is the float32 lse (the backward given the same rounded out); with a document mask.
TEST_F(FlashAttention, PositionedBfloat16IsTheFloat32ArithmeticRounded) {
  const int64_t B = 2, Tk = 128, Tq = 64, H = 4, KV = 2, hd = 16, C = H * hd, Ckv = KV * hd;
  const auto q = rounded_to_bf16(randn(size_t(B * Tq * C), 41, 1.5f));
  const auto k = rounded_to_bf16(randn(size_t(B * Tk * Ckv), 42, 1.5f));
  const auto v = rounded_to_bf16(randn(size_t(B * Tk * Ckv), 43, 1.0f));
  const auto dout = rounded_to_bf16(randn(size_t(B * Tq * C), 44, 1.0f));
  std::vector<int32_t> pos, lo;  // rank 0 of cp 2: chunks 0 and 3 of 4, documents of 45 rows
  for (int64_t b = 0; b < B; ++b)
    for (int64_t chunk : {0, 3})
      for (int64_t t = chunk * 32; t < (chunk + 1) * 32; ++t) pos.push_back(int32_t(t)), lo.push_back(int32_t(t / 45 * 45));
  std::vector<float> o(q.size()), l(size_t(B * H * Tq)), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::flash_attention_gqa_forward_at(q.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(), B, Tq, Tk, pos.data(),
                                      H, KV, hd, lo.data());
  const auto q16 = to_bf16(q), k16 = to_bf16(k), v16 = to_bf16(v), dout16 = to_bf16(dout);
  std::vector<bf16> o16(q.size()), dq16(q.size()), dk16(k.size()), dv16(v.size());
  std::vector<float> l16(l.size());
  cpu::flash_attention_gqa_forward_at(q16.data(), k16.data(), v16.data(), C, Ckv, o16.data(), l16.data(), B, Tq, Tk,
                                      pos.data(), H, KV, hd, lo.data());
  EXPECT_EQ(l, l16);
  EXPECT_EQ(rounded_to_bf16(o), to_f32(o16));
  const auto o_rounded = to_f32(o16);
  cpu::flash_attention_gqa_backward_at(dout.data(), q.data(), k.data(), v.data(), C, Ckv, o_rounded.data(), l.data(),
                                       dq.data(), dk.data(), dv.data(), B, Tq, Tk, pos.data(), H, KV, hd, lo.data());
  cpu::flash_attention_gqa_backward_at(dout16.data(), q16.data(), k16.data(), v16.data(), C, Ckv, o16.data(),
                                       l16.data(), dq16.data(), dk16.data(), dv16.data(), B, Tq, Tk, pos.data(), H, KV,
                                       hd, lo.data());
  EXPECT_EQ(rounded_to_bf16(dq), to_f32(dq16));
  EXPECT_EQ(rounded_to_bf16(dk), to_f32(dk16));
  EXPECT_EQ(rounded_to_bf16(dv), to_f32(dv16));
}

namespace {
// Columns [0, w) of each of the heads of x (rows, ld), heads hd apart from column c0: (rows, heads * w).
std::vector<float> head_columns(const std::vector<float>& x, int64_t ld, int64_t c0, int64_t heads, int64_t hd,
                                int64_t w) {
  std::vector<float> r;
  for (size_t row = 0; row < x.size() / size_t(ld); ++row)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < w; ++c) r.push_back(x[row * size_t(ld) + size_t(c0 + h * hd + c)]);
  return r;
}
// x (rows, heads * w) with each head widened to hd columns by zeros: (rows, heads * hd).
std::vector<float> zero_padded_heads(const std::vector<float>& x, int64_t heads, int64_t w, int64_t hd) {
  const size_t rows = x.size() / size_t(heads * w);
  std::vector<float> r(rows * size_t(heads * hd), 0.0f);
  for (size_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < w; ++c) r[row * size_t(heads * hd) + size_t(h * hd + c)] = x[row * size_t(heads * w) + size_t(h * w + c)];
  return r;
}
}  // namespace

// Value heads narrower than query/key heads (DeepSeek-V3's MLA: 192 and 128; here 24 and 16): attention with
// v's heads of hd_v columns is the reference's attention with v zero-padded to hd columns, restricted to the
// first hd_v columns of each head of out and dv (the padded columns of dout are 0, so dq and dk are unchanged).
// The reference keeps the probabilities (attention_forward/backward); float32, 1e-5 as above; lse as above.
TEST_F(FlashAttention, NarrowerValueHeadsMatchTheReference) {
  const Shape s{2, 150, 72, 3};  // hd = 24 (T past one tile)
  const int64_t hd = s.C / s.H, hd_v = 16, Cv = s.H * hd_v;
  const auto q = randn(size_t(s.B * s.T * s.C), 51, 1.5f), k = randn(size_t(s.B * s.T * s.C), 52, 1.5f);
  const auto v = randn(size_t(s.B * s.T * Cv), 53, 1.0f), dout = randn(size_t(s.B * s.T * Cv), 54, 1.0f);
  // The reference's packed (B*T, 3C) rows: [q | k | v padded].
  const auto vp = zero_padded_heads(v, s.H, hd_v, hd), doutp = zero_padded_heads(dout, s.H, hd_v, hd);
  std::vector<float> qkv;
  for (int64_t r = 0; r < s.B * s.T; ++r) {
    qkv.insert(qkv.end(), q.begin() + r * s.C, q.begin() + (r + 1) * s.C);
    qkv.insert(qkv.end(), k.begin() + r * s.C, k.begin() + (r + 1) * s.C);
    qkv.insert(qkv.end(), vp.begin() + r * s.C, vp.begin() + (r + 1) * s.C);
  }
  const Reference ref = reference(s, qkv, doutp);
  std::vector<float> out(dout.size()), lse(size_t(s.B * s.H * s.T));
  std::vector<float> dq(q.size(), NAN), dk(k.size(), NAN), dv(v.size(), NAN);  // overwritten, not accumulated
  cpu::flash_attention_gqa_forward(q.data(), k.data(), v.data(), s.C, s.C, out.data(), lse.data(), s.B, s.T, s.H, s.H,
                                   hd, nullptr, hd_v, Cv);
  cpu::flash_attention_gqa_backward(dout.data(), q.data(), k.data(), v.data(), s.C, s.C, out.data(), lse.data(),
                                    dq.data(), dk.data(), dv.data(), s.B, s.T, s.H, s.H, hd, nullptr, hd_v, Cv);
  EXPECT_LE(relative_error(out, head_columns(ref.out, s.C, 0, s.H, hd, hd_v)), 1e-5) << "out";
  EXPECT_LE(relative_error(dq, columns(ref.dqkv, 3 * s.C, 0, s.C)), 1e-5) << "dq";
  EXPECT_LE(relative_error(dk, columns(ref.dqkv, 3 * s.C, s.C, s.C)), 1e-5) << "dk";
  EXPECT_LE(relative_error(dv, head_columns(ref.dqkv, 3 * s.C, 2 * s.C, s.H, hd, hd_v)), 1e-5) << "dv";
  for (size_t i = 0; i < ref.lse.size(); ++i)
    ASSERT_NEAR(lse[i], ref.lse[i], 2e-6 * std::max(1.0, std::fabs(ref.lse[i]))) << "row " << i;
}

// The same identity for grouped-query heads, document masks and context parallelism's positioned kernels (rank 0
// and 1 of cp 2, dk and dv summed over them), against the kernels' own equal-width path on the zero-padded values
// (itself checked against the reference above and against each document alone): 4e-6 of each output's magnitude.
// And the narrow path's thread-count independence, bit for bit.
TEST_F(FlashAttention, NarrowerValueHeadsEqualZeroPaddedValuesWithDocumentsAndChunks) {
  const int64_t B = 2, T = 160, H = 4, KV = 2, hd = 24, hd_v = 16, C = H * hd, Ckv = KV * hd;
  const int64_t Cv = H * hd_v, Ckv_v = KV * hd_v;
  const auto q = randn(size_t(B * T * C), 61, 1.5f), k = randn(size_t(B * T * Ckv), 62, 1.5f);
  const auto v = randn(size_t(B * T * Ckv_v), 63, 1.0f), dout = randn(size_t(B * T * Cv), 64, 1.0f);
  const auto vp = zero_padded_heads(v, KV, hd_v, hd), doutp = zero_padded_heads(dout, H, hd_v, hd);
  std::vector<int32_t> doc_start(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, start = 0; t < T; ++t) {
      if (t > 0 && t % (41 + 30 * b) == 0) start = t;  // documents of 41 (71) rows
      doc_start[size_t(b * T + t)] = int32_t(start);
    }
  for (bool docs : {false, true}) {
    SCOPED_TRACE(docs ? "documents" : "causal");
    const int32_t* ds = docs ? doc_start.data() : nullptr;
    // The padded run: (B*T, C) out and dq, (B*T, Ckv) dk and dv.
    std::vector<float> po(size_t(B * T * C)), pl(size_t(B * H * T)), pdq(q.size()), pdk(k.size()), pdv(k.size());
    cpu::flash_attention_gqa_forward(q.data(), k.data(), vp.data(), C, Ckv, po.data(), pl.data(), B, T, H, KV, hd, ds);
    cpu::flash_attention_gqa_backward(doutp.data(), q.data(), k.data(), vp.data(), C, Ckv, po.data(), pl.data(),
                                      pdq.data(), pdk.data(), pdv.data(), B, T, H, KV, hd, ds);
    // The narrow run, whole sequences, at 1 and 3 threads.
    auto narrow = [&] {
      std::vector<float> o(dout.size()), l(pl.size()), dq(q.size()), dk(k.size()), dv(v.size());
      cpu::flash_attention_gqa_forward(q.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(), B, T, H, KV, hd, ds,
                                       hd_v, Ckv_v);
      cpu::flash_attention_gqa_backward(dout.data(), q.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(),
                                        dq.data(), dk.data(), dv.data(), B, T, H, KV, hd, ds, hd_v, Ckv_v);
      return std::vector<std::vector<float>>{o, l, dq, dk, dv};
    };
    cpu::set_threads(1);
    const auto n1 = narrow();
    cpu::set_threads(3);
    const auto n3 = narrow();
    cpu::set_threads(2);
    for (size_t i = 0; i < n1.size(); ++i) EXPECT_EQ(n1[i], n3[i]) << "output " << i << " differs with 3 threads";
    EXPECT_LE(relative_error(n1[0], head_columns(po, C, 0, H, hd, hd_v)), 4e-6) << "out";
    EXPECT_LE(relative_error(n1[1], pl), 4e-6) << "lse";
    EXPECT_LE(relative_error(n1[2], pdq), 4e-6) << "dq";
    EXPECT_LE(relative_error(n1[3], pdk), 4e-6) << "dk";
    EXPECT_LE(relative_error(n1[4], head_columns(pdv, Ckv, 0, KV, hd, hd_v)), 4e-6) << "dv";
    // cp 2: rank i holds chunks i and 3 - i of each sequence (4 chunks of 40 rows).
    const int64_t cp = 2, c = T / (2 * cp), Tq = 2 * c;
    std::vector<float> dk_sum(k.size(), 0.f), dv_sum(v.size(), 0.f);
    for (int64_t i = 0; i < cp; ++i) {
      std::vector<int32_t> pos, lo;
      std::vector<float> ql, dl, want_o, want_dq;  // (B*Tq, C) queries, (B*Tq, Cv) output gradients
      for (int64_t b = 0; b < B; ++b)
        for (int64_t chunk : {i, 2 * cp - 1 - i})
          for (int64_t t = chunk * c; t < (chunk + 1) * c; ++t) {
            const size_t row = size_t(b * T + t);
            pos.push_back(int32_t(t));
            lo.push_back(doc_start[row]);
            ql.insert(ql.end(), q.begin() + row * C, q.begin() + (row + 1) * C);
            dl.insert(dl.end(), dout.begin() + row * Cv, dout.begin() + (row + 1) * Cv);
            want_o.insert(want_o.end(), n1[0].begin() + row * Cv, n1[0].begin() + (row + 1) * Cv);
            want_dq.insert(want_dq.end(), n1[2].begin() + row * C, n1[2].begin() + (row + 1) * C);
          }
      std::vector<float> o(size_t(B * Tq * Cv)), l(size_t(B * H * Tq)), g(ql.size()), gk(k.size()), gv(v.size());
      cpu::flash_attention_gqa_forward_at(ql.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(), B, Tq, T,
                                          pos.data(), H, KV, hd, docs ? lo.data() : nullptr, hd_v, Ckv_v);
      cpu::flash_attention_gqa_backward_at(dl.data(), ql.data(), k.data(), v.data(), C, Ckv, o.data(), l.data(),
                                           g.data(), gk.data(), gv.data(), B, Tq, T, pos.data(), H, KV, hd,
                                           docs ? lo.data() : nullptr, hd_v, Ckv_v);
      EXPECT_LE(relative_error(o, want_o), 4e-6) << "out of rank " << i;
      EXPECT_LE(relative_error(g, want_dq), 4e-6) << "dq of rank " << i;
      for (size_t e = 0; e < gk.size(); ++e) dk_sum[e] += gk[e];
      for (size_t e = 0; e < gv.size(); ++e) dv_sum[e] += gv[e];
    }
    EXPECT_LE(relative_error(dk_sum, n1[3]), 4e-6) << "dk summed over the ranks";
    EXPECT_LE(relative_error(dv_sum, n1[4]), 4e-6) << "dv summed over the ranks";
  }
}
