// Runs the tensor-core flash attention kernels (kernels/cuda/flash_attention_mma.cu) of a base commit and of the
// working tree on a CPU model of the warp-level PTX they use (warp_model.hpp), on the same random bf16 inputs, and
// requires the same bits: out, lse, dq, dk, dv, for head sizes 64 and 128, grouped-query heads, document masks and
// partial tiles, with cp.async copies landing at issue and as late as their wait allows. The forward is also
// checked against a double-precision reference, which keeps the model itself honest. A development aid for a
// change that keeps the kernels' arithmetic (tiling, staging, fragment loads) when no GPU is at hand; the GPU
// tests (test_backend_ops on a device) remain the authority. Usage: scripts/mma_model/check.sh [base commit]
#include <cstdio>
#include <random>
#include "warp_model.hpp"
#define __global__
#define __device__
#define __launch_bounds__(x)
#define RELAY_ASSERT(c, m)
#include "base_kernels.inc"  // namespace oldk: the base commit's kernels
#include "tree_kernels.inc"  // namespace newk: the working tree's

struct Case { int B, T, H, KV, HD; bool doc; };
static float f(bf16 x) { return __bfloat162float(x); }

template <int HD>
int run(const Case& cs, int mode) {
  const int B = cs.B, T = cs.T, H = cs.H, KV = cs.KV, C = H * HD, W = (H + 2 * KV) * HD;
  constexpr int BN = HD <= 64 ? 64 : 32;
  std::mt19937 rng(1234 + T + H + HD);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16> qkv(size_t(B) * T * W), dout(size_t(B) * T * C);
  for (auto& x : qkv) x = __float2bfloat16(nd(rng));
  for (auto& x : dout) x = __float2bfloat16(nd(rng));
  std::vector<int32_t> ds;
  if (cs.doc) {
    ds.resize(size_t(B) * T);
    for (int b = 0; b < B; ++b) {
      int start = 0;
      for (int t = 0; t < T; ++t) {
        if (t > 0 && rng() % 37 == 0) start = t;
        ds[size_t(b) * T + t] = start;
      }
    }
  }
  const int32_t* dsp = cs.doc ? ds.data() : nullptr;
  const bf16 *q = qkv.data(), *k = q + C, *v = k + KV * HD;
  const unsigned gq = unsigned((T + 63) / 64);
  g_cp_mode = mode;
  std::vector<bf16> out[2];
  std::vector<float> lse[2];
  for (int w = 0; w < 2; ++w) {
    out[w].assign(size_t(B) * T * C, __float2bfloat16(0.f));
    lse[w].assign(size_t(B) * H * T, 0.f);
    bf16* o = out[w].data();
    float* l = lse[w].data();
    launch(unsigned(B * H), gq, 128, [&] {
      if (w == 0) oldk::mma_forward_kernel<HD>(q, k, v, W, W, o, l, T, H, KV, dsp);
      else newk::mma_forward_kernel<HD>(q, k, v, W, W, o, l, T, H, KV, dsp);
    });
  }
  int bad = 0;
  bad += std::memcmp(out[0].data(), out[1].data(), out[0].size() * 2) != 0;
  bad += std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * 4) != 0;
  // reference forward in double
  double max_err = 0;
  std::vector<float> rowdot(size_t(B) * H * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int kh = h / (H / KV);
      for (int t = 0; t < T; ++t) {
        const int lo = dsp ? dsp[size_t(b) * T + t] : 0;
        std::vector<double> s(size_t(t + 1));
        double mx = -1e300;
        for (int u = lo; u <= t; ++u) {
          double a = 0;
          for (int d = 0; d < HD; ++d)
            a += double(f(q[(size_t(b) * T + t) * W + h * HD + d])) * f(k[(size_t(b) * T + u) * W + kh * HD + d]);
          s[size_t(u)] = a / std::sqrt(double(HD));
          mx = std::max(mx, s[size_t(u)]);
        }
        double z = 0;
        for (int u = lo; u <= t; ++u) z += std::exp(s[size_t(u)] - mx);
        double dot = 0;
        for (int d = 0; d < HD; ++d) {
          double o = 0;
          for (int u = lo; u <= t; ++u) o += std::exp(s[size_t(u)] - mx) / z * f(v[(size_t(b) * T + u) * W + kh * HD + d]);
          const float got = f(out[1][(size_t(b) * T + t) * C + h * HD + d]);
          max_err = std::max(max_err, std::abs(o - got));
          dot += double(f(dout[(size_t(b) * T + t) * C + h * HD + d])) * got;
        }
        rowdot[(size_t(b) * H + h) * T + t] = float(dot);
        max_err = std::max(max_err, std::abs(mx + std::log(z) - lse[1][(size_t(b) * H + h) * T + t]));
      }
    }
  // backward: dq, dk, dv into fused buffers
  std::vector<bf16> g[2];
  for (int w = 0; w < 2; ++w) {
    g[w].assign(qkv.size(), __float2bfloat16(0.f));
    bf16 *dq = g[w].data(), *dk = dq + C, *dv = dk + KV * HD;
    const bf16* o = out[1].data();
    (void)o;
    launch(unsigned(B * H), gq, 128, [&] {
      if (w == 0) oldk::mma_dq_kernel<HD, BN>(dout.data(), q, k, v, W, W, lse[1].data(), rowdot.data(), dq, T, H, KV, dsp);
      else newk::mma_dq_kernel<HD, BN>(dout.data(), q, k, v, W, W, lse[1].data(), rowdot.data(), dq, T, H, KV, dsp);
    });
    launch(unsigned(B * KV), gq, 128, [&] {
      if (w == 0)
        oldk::mma_dkv_kernel<HD, BN>(dout.data(), q, k, v, W, W, lse[1].data(), rowdot.data(), dk, dv, T, H, KV, dsp);
      else
        newk::mma_dkv_kernel<HD, BN>(dout.data(), q, k, v, W, W, lse[1].data(), rowdot.data(), dk, dv, T, H, KV, dsp);
    });
  }
  bad += max_err > 0.05;  // bf16 outputs of values ~1: a few units of 2^-8, never more
  const bool same_bwd = std::memcmp(g[0].data(), g[1].data(), g[0].size() * 2) == 0;
  bad += !same_bwd;
  double gmax = 0, gsum = 0;
  for (auto x : g[1]) { gmax = std::max(gmax, double(std::abs(f(x)))); gsum += std::abs(f(x)); }
  std::printf("B %d T %d H %d KV %d HD %d doc %d cp %s: forward %s (max |out - ref| %.3g), backward %s (max |grad| %.3g, "
              "mean %.3g)\n", B, T, H, KV, HD, int(cs.doc), mode ? "late" : "early", bad ? "DIFFERS or off the reference" : "old == new",
              max_err, same_bwd ? "old == new" : "DIFFERS", gmax, gsum / g[1].size());
  return bad;
}

int main() {
  int bad = 0;
  const Case cases[] = {{1, 200, 2, 1, 64, false}, {2, 130, 4, 2, 64, true}, {1, 100, 2, 2, 128, false},
                        {1, 160, 2, 1, 128, true}, {1, 64, 1, 1, 64, false}};
  for (int mode : {0, 1})
    for (const Case& c : cases) bad += c.HD == 64 ? run<64>(c, mode) : run<128>(c, mode);
  std::printf("%s\n", bad ? "FAIL" : "all equal");
  return bad != 0;
}
