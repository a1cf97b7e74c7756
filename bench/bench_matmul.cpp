// GPT-2 124M's GEMMs on the CPU: oneDNN's dnnl_sgemm beside cpu::matmul's primitives in f32, bf16 in
// with f32 or bf16 out, and with a fused bias; each checked against a double-precision reference on
// sampled elements. Measures; never fails. Usage: bench_matmul [threads [reps [wall|cpu [fwd]]]]
// ("fwd": only the forward x W^T shapes, where a linear layer's bias is fused).
// "cpu" times by process CPU seconds / threads, for a machine shared with other jobs (run it with
// OMP_WAIT_POLICY=passive, so that a thread waiting at a barrier sleeps instead of spinning).
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/matmul.hpp"

using namespace relay;

namespace {

// GPT-2 124M with 2048 tokens per step: rows = 2048, C = 768, 3C = 2304, 4C = 3072, V = 50257.
struct Gemm {
  const char* what;
  bool ta, tb;
  int64_t m, n, k;
  float beta;  // weight gradients accumulate over micro-batches
};
const Gemm kGemms[] = {
    {"fwd qkv      x W^T", false, true, 2048, 2304, 768, 0.f},
    {"fwd fc       x W^T", false, true, 2048, 3072, 768, 0.f},
    {"fwd proj     x W^T", false, true, 2048, 768, 3072, 0.f},
    {"fwd lm_head  x wte^T", false, true, 2048, 50257, 768, 0.f},
    {"bwd-in qkv   dy W", false, false, 2048, 768, 2304, 0.f},
    {"bwd-in head  dy wte", false, false, 2048, 768, 50257, 0.f},
    {"wgrad qkv    dy^T x", true, false, 2304, 768, 2048, 1.f},
    {"wgrad head   dy^T x", true, false, 50257, 768, 2048, 1.f},
};

// Column order of the table.
// sgemm+b is dnnl_sgemm then cpu::add_bias, the unfused f32 linear layer that mm f32+b would replace.
// wide>bf16 is bf16>bf16 with the inputs widened to f32 for dnnl_sgemm (cpu::Bf16Gemm::widened, train.cpu_bf16_gemm).
enum Variant { kSgemm, kSgemmBias, kF32, kF32Bias, kBf16F32, kBf16Bf16, kBf16Bias, kWideBf16, kVariants };
const char* kVariantNames[kVariants] = {"sgemm f32", "sgemm+b",     "mm f32",   "mm f32+b",
                                        "bf16>f32",  "bf16>bf16", "bf16>bf16+b", "wide>bf16"};

// Uniform in [-1, 1) from a hash of the index: cheap enough for 10^8 elements, independent of threads.
void fill(std::vector<float>& v, uint64_t seed) {
  const int64_t n = int64_t(v.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = float(double(splitmix64(seed * 0x9E37 + uint64_t(i)) >> 11) * 0x1.0p-52 - 1.0);
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  const int64_t n = int64_t(v.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f32_to_bf16(v[size_t(i)]);
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

bool cpu_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

double process_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Wall seconds of f, or (cpu_clock) the CPU seconds it used spread over the threads: the wall time
// it would take with the cores to itself, when other jobs take turns on them.
double seconds(const std::function<void()>& f, bool cpu_clock, int threads) {
  if (cpu_clock) {
    const double t0 = process_cpu_seconds();
    f();
    return (process_cpu_seconds() - t0) / threads;
  }
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// " title " centred in a rule of dashes `width` wide, over the columns it names.
std::string ruled(const std::string& title, size_t width) {
  const size_t left = (width - title.size()) / 2;
  return std::string(left, '-') + title + std::string(width - left - title.size(), '-');
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_num_procs();
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  const bool cpu_clock = argc > 3 && std::string(argv[3]) == "cpu";
  const bool forward_only = argc > 4 && std::string(argv[4]) == "fwd";
  cpu::set_threads(threads);
  const dnnl_version_t* ver = dnnl_version();
  std::printf("# bench_matmul: GPT-2 124M GEMMs (rows = 2048 tokens, C = 768, V = 50257), %d threads, best of %d\n",
              threads, reps);
  std::printf("# cpu: %s   avx512f %s   avx512_bf16 %s   amx_bf16 %s   oneDNN %d.%d.%d\n", cpu_model().c_str(),
              cpu_flag("avx512f") ? "yes" : "no", cpu_flag("avx512_bf16") ? "yes" : "no",
              cpu_flag("amx_bf16") ? "yes" : "no", ver->major, ver->minor, ver->patch);
  std::printf("# c (m, n) = op(a) @ op(b) [+ bias (n)] + beta c.  GFLOP/s = 2 m n k / s (best run after a warm-up),\n");
  if (cpu_clock)
    std::printf("# s = process CPU seconds / threads (OMP_WAIT_POLICY=%s); load average at start %s\n",
                std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "unset: spinning waits count",
                load_average().c_str());
  else
    std::printf("# s = wall seconds; load average at start %s (other jobs on the cores lower every column)\n",
                load_average().c_str());
  std::printf("# sgemm = dnnl_sgemm; mm = cpu::matmul (a oneDNN matmul primitive); +b = fused bias (f32 / bf16);\n");
  std::printf("# sgemm+b = dnnl_sgemm then cpu::add_bias (a second pass over c); wide = bf16 inputs widened to f32\n");
  std::printf("# for dnnl_sgemm, the output rounded to bf16 once (train.cpu_bf16_gemm = \"widened\").\n");
  std::printf("# err = max |c - ref| / max |ref| over 64 sampled elements, ref in double from the inputs as stored;\n");
  std::printf(
      "# ok when f32 err < 1e-5 and bf16 err < 8e-3 (a bf16 output rounds once, 2^-9 relative, after f32 sums)\n");
  std::printf("#\n# %-20s %2s %6s %6s %6s %4s  %s  %s\n", "", "", "", "", "", "", ruled(" GFLOP/s ", 87).c_str(),
              ruled(" max rel err ", 17).c_str());
  std::printf("# %-20s %2s %6s %6s %6s %4s ", "gemm", "op", "m", "n", "k", "beta");
  for (const char* v : kVariantNames) std::printf(" %10s", v);
  std::printf("  %8s %8s  %5s\n", "f32", "bf16", "check");

  std::vector<std::string> impls;
  for (const Gemm& g : kGemms) {
    if (forward_only && std::string(g.what).rfind("fwd", 0) != 0) continue;
    const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
    const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
    std::vector<float> a(size_t(a_rows * a_cols)), b(size_t(b_rows * b_cols)), c0(size_t(g.m * g.n)), bias(size_t(g.n));
    fill(a, 1);
    fill(b, 2);
    fill(c0, 3);
    fill(bias, 4);
    const std::vector<bf16> a16 = to_bf16(a), b16 = to_bf16(b), c016 = to_bf16(c0), bias16 = to_bf16(bias);
    std::vector<float> c(c0.size());
    std::vector<bf16> c16(c0.size());

    Rng pick(5, uint64_t(g.m * g.n));
    std::vector<std::pair<int64_t, int64_t>> samples;
    for (int s = 0; s < 64; ++s)
      samples.push_back({int64_t(pick.below(uint64_t(g.m))), int64_t(pick.below(uint64_t(g.n)))});

    // One closure per variant; the checked warm-up runs first (it creates the primitive), then the
    // timed runs go round the variants in turn, so a burst of load elsewhere hits all columns alike.
    std::vector<std::function<void()>> runs;
    double best[kVariants], err[kVariants];
    for (int v = 0; v < kVariants; ++v) {
      const bool in16 = v >= kBf16F32, out16 = v >= kBf16Bf16;  // wide>bf16 too
      const bool with_bias = v == kSgemmBias || v == kF32Bias || v == kBf16Bias;
      cpu::MatmulArgs p;
      p.trans_a = g.ta;
      p.trans_b = g.tb;
      p.m = g.m;
      p.n = g.n;
      p.k = g.k;
      p.lda = a_cols;
      p.ldb = b_cols;
      p.ldc = g.n;
      p.ab_type = in16 ? DType::bf16 : DType::f32;
      p.c_type = out16 ? DType::bf16 : DType::f32;
      p.bias_type = in16 ? DType::bf16 : DType::f32;
      p.beta = g.beta;
      const void* pa = in16 ? static_cast<const void*>(a16.data()) : a.data();
      const void* pb = in16 ? static_cast<const void*>(b16.data()) : b.data();
      void* pc = out16 ? static_cast<void*>(c16.data()) : c.data();
      const void* pbias = !with_bias ? nullptr : in16 ? static_cast<const void*>(bias16.data()) : bias.data();
      if (v == kSgemm)
        runs.push_back([&, a_cols, b_cols] {
          dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.f, a.data(), a_cols, b.data(), b_cols, g.beta,
                     c.data(), g.n);
        });
      else if (v == kSgemmBias)
        runs.push_back([&, a_cols, b_cols] {
          dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.f, a.data(), a_cols, b.data(), b_cols, g.beta,
                     c.data(), g.n);
          cpu::add_bias(c.data(), bias.data(), g.m, g.n);
        });
      else if (v == kWideBf16)
        runs.push_back([p, pa, pb, pc, pbias] {
          cpu::set_bf16_gemm(cpu::Bf16Gemm::widened);
          cpu::matmul(p, pa, pb, pc, pbias);
          cpu::set_bf16_gemm(cpu::Bf16Gemm::native);
        });
      else
        runs.push_back([p, pa, pb, pc, pbias] { cpu::matmul(p, pa, pb, pc, pbias); });

      if (out16)
        c16 = c016;
      else
        c = c0;
      runs[size_t(v)]();
      double ref_max = 0, err_max = 0;
      for (auto [i, j] : samples) {
        double s = 0;
        for (int64_t q = 0; q < g.k; ++q) {
          const size_t ai = size_t(g.ta ? q * a_cols + i : i * a_cols + q);
          const size_t bi = size_t(g.tb ? j * b_cols + q : q * b_cols + j);
          s += in16 ? double(bf16_to_f32(a16[ai])) * bf16_to_f32(b16[bi]) : double(a[ai]) * b[bi];
        }
        const size_t ci = size_t(i * g.n + j);
        if (with_bias) s += in16 ? double(bf16_to_f32(bias16[size_t(j)])) : double(bias[size_t(j)]);
        s += double(g.beta) * (out16 ? double(bf16_to_f32(c016[ci])) : double(c0[ci]));
        const double got = out16 ? double(bf16_to_f32(c16[ci])) : double(c[ci]);
        ref_max = std::max(ref_max, std::abs(s));
        err_max = std::max(err_max, std::abs(got - s));
      }
      err[v] = err_max / ref_max;
      best[v] = 1e30;
      if (v == kF32) impls.push_back(cat(g.what, "  f32: ", cpu::matmul_impl(p, with_bias)));
      if (v == kBf16Bias) impls.back() += cat(", bf16+b: ", cpu::matmul_impl(p, with_bias));
    }
    for (int r = 0; r < reps; ++r)
      for (int v = 0; v < kVariants; ++v) best[v] = std::min(best[v], seconds(runs[size_t(v)], cpu_clock, threads));
    double gflops[kVariants];
    for (int v = 0; v < kVariants; ++v) gflops[v] = 2.0 * double(g.m) * double(g.n) * double(g.k) / best[v] / 1e9;
    const double err32 = std::max({err[kSgemm], err[kSgemmBias], err[kF32], err[kF32Bias]});
    const double err16 = std::max({err[kBf16F32], err[kBf16Bf16], err[kBf16Bias], err[kWideBf16]});
    const bool ok = err32 < 1e-5 && err16 < 8e-3;
    std::printf("  %-20s %c%c %6lld %6lld %6lld %4.0f ", g.what, g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', (long long)g.m,
                (long long)g.n, (long long)g.k, double(g.beta));
    for (double x : gflops) std::printf(" %10.1f", x);
    std::printf("  %8.1e %8.1e  %5s\n", err32, err16, ok ? "ok" : "WRONG");
    std::fflush(stdout);
  }
  std::printf("#\n# load average at end %s; oneDNN implementations (cpu::matmul_impl):\n", load_average().c_str());
  for (const std::string& s : impls) std::printf("#   %s\n", s.c_str());
}
