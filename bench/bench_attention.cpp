// Causal self-attention forward + backward on the CPU: the reference kernels that store the (B, H, T, T)
// probabilities (kernels/cpu/transformer.cpp) against FlashAttention-2 tiles (kernels/cpu/flash_attention.cpp,
// arXiv:2307.08691) in float32 and bfloat16, and the grouped-query form (Llama: H / 4 key/value heads, the
// same kernels on separate q, k, v). Measures; never fails. Usage: bench_attention [threads ...]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/flash_attention.hpp"

using namespace relay;

namespace {

std::string cpu_model() {
  std::string model = "unknown CPU";
  if (FILE* p = popen("lscpu 2>/dev/null", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, p)) {
      std::string s(line);
      if (s.rfind("Model name:", 0) == 0) {
        model = s.substr(s.find_first_not_of(" \t", 11));
        model.erase(model.find_last_not_of(" \t\n") + 1);
      }
    }
    pclose(p);
  }
  return model;
}

// The first three fields of /proc/loadavg and a newline: other work on the machine skews the timings.
std::string load_average() {
  std::string avg = "unknown\n";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    double a[3];
    if (std::fscanf(f, "%lf %lf %lf", &a[0], &a[1], &a[2]) == 3) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f\n", a[0], a[1], a[2]);
      avg = buf;
    }
    std::fclose(f);
  }
  return avg;
}

// Wall and process CPU seconds per call of fn: one warm-up call, then repeats until 1 s has passed (at
// least 3 calls).
struct Timing {
  double wall = 0, cpu = 0;
};
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
template <typename Fn>
Timing time_per_call(Fn&& fn) {
  fn();
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  double sec = 0;
  do {
    fn();
    ++reps;
    sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (sec < 1.0 || reps < 3);
  return {sec / reps, (cpu_seconds() - c0) / reps};
}

// max |a - b| / max |ref| over one output.
double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(ref[i]));
    err = d == d ? std::max(err, d) : INFINITY;
    mag = std::max(mag, std::fabs(double(ref[i])));
  }
  return err / std::max(mag, 1.0);
}

template <typename Elem>
std::vector<float> widen(const std::vector<Elem>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = load(v[i]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads;
  for (int i = 1; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
  if (threads.empty()) threads = {2};
  struct Shape { int64_t B, T, C, H; };
  const Shape shapes[] = {{2, 1024, 768, 12}, {2, 256, 768, 12}, {16, 64, 128, 4}};

  std::printf("# causal self-attention forward + backward, %s, load average %s", cpu_model().c_str(),
              load_average().c_str());
  std::printf("# GFLOP/s = 7 x B x H x T^2 x hd / s: forward 2 and backward 5 causal half GEMMs of 2 x (T^2 / 2) x hd\n");
  std::printf("# (S = Q K^T, O = P V; S again, dV, dP, dQ, dK), hd = C / H; flops the reference also needs\n");
  std::printf("# cpu: process CPU time / (wall time x threads); below ~100%% other work took the cores\n");
  std::printf("# ref: attention_forward + attention_backward over the stored (B, H, T, T) probabilities\n");
  std::printf("# err: max |x - ref| / max(max |ref|, 1) over out and dqkv, inputs bf16-exact;\n");
  std::printf("#      ok when <= 1e-5 (float32) or 1e-2 (bf16: outputs rounded to 8 bits)\n");
  std::printf("# gqa: q (B*T, C), k, v (B*T, C/4): H/4 key/value heads; err against flash f32 on the packed qkv\n");
  std::printf("#      with each key/value head repeated (dk, dv summed over the group's heads)\n");
  std::printf("%4s %6s %5s %3s %10s %7s %10s %10s %10s %10s %6s %9s %4s\n", "B", "T", "C", "H", "kernel", "threads",
              "fwd ms", "bwd ms", "total ms", "GFLOP/s", "cpu", "err", "");
  for (const Shape& s : shapes) {
    const int64_t hd = s.C / s.H, rows = s.B * s.T;
    const double flops = 7.0 * double(s.B * s.H) * double(s.T) * double(s.T) * double(hd);
    std::vector<float> qkv(size_t(rows * 3 * s.C)), dout(size_t(rows * s.C));
    Rng rng(1, 2);
    for (auto& x : qkv) x = round_bf16(float(rng.normal()));  // bf16-exact: one reference for every kernel
    for (auto& x : dout) x = round_bf16(float(rng.normal()));
    std::vector<bf16> qkv16(qkv.size()), dout16(dout.size());
    for (size_t i = 0; i < qkv.size(); ++i) qkv16[i] = f32_to_bf16(qkv[i]);
    for (size_t i = 0; i < dout.size(); ++i) dout16[i] = f32_to_bf16(dout[i]);

    std::vector<float> att(size_t(s.B * s.H * s.T * s.T)), ref_out(size_t(rows * s.C)), ref_dqkv(qkv.size());
    std::vector<float> lse(size_t(s.B * s.H * s.T));
    // err < 0: the reference's own row.
    auto row = [&](const char* kernel, int t, Timing fwd, Timing bwd, double err, double tol) {
      char e[16] = "-";
      if (err >= 0) std::snprintf(e, sizeof e, "%.1e", err);
      const double wall = fwd.wall + bwd.wall;
      std::printf("%4lld %6lld %5lld %3lld %10s %7d %10.2f %10.2f %10.2f %10.1f %5.0f%% %9s %4s\n", (long long)s.B,
                  (long long)s.T, (long long)s.C, (long long)s.H, kernel, t, fwd.wall * 1e3, bwd.wall * 1e3,
                  wall * 1e3, flops / wall / 1e9, 100 * (fwd.cpu + bwd.cpu) / (wall * t), e,
                  err < 0 ? "ref" : err <= tol ? "ok" : "BAD");
      std::fflush(stdout);
    };
    // Grouped-query attention with KV = H / 4: q and the first KV heads of k, v from qkv, against the packed
    // flash kernel on those heads repeated (its reference, computed once per shape).
    const int64_t KV = s.H / 4, Ckv = KV * hd, group = s.H / std::max<int64_t>(KV, 1);
    std::vector<float> gq(size_t(rows * s.C)), gk(size_t(rows * Ckv)), gv(gk.size()), rep(qkv.size());
    std::vector<float> rep_out, rep_dq, rep_dk, rep_dv;
    if (s.H % 4 == 0) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < s.C; ++c) gq[size_t(r * s.C + c)] = qkv[size_t(r * 3 * s.C + c)];
        for (int64_t c = 0; c < Ckv; ++c) {
          gk[size_t(r * Ckv + c)] = qkv[size_t(r * 3 * s.C + s.C + c)];
          gv[size_t(r * Ckv + c)] = qkv[size_t(r * 3 * s.C + 2 * s.C + c)];
        }
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < hd; ++d) {
            const size_t at = size_t(r * 3 * s.C + h * hd + d), kv = size_t(r * Ckv + (h / group) * hd + d);
            rep[at] = gq[size_t(r * s.C + h * hd + d)];
            rep[at + size_t(s.C)] = gk[kv];
            rep[at + size_t(2 * s.C)] = gv[kv];
          }
      }
      std::vector<float> out(size_t(rows * s.C)), dqkv(rep.size());
      cpu::flash_attention_forward(rep.data(), out.data(), lse.data(), s.B, s.T, s.C, s.H);
      cpu::flash_attention_backward(dout.data(), rep.data(), out.data(), lse.data(), dqkv.data(), s.B, s.T, s.C, s.H);
      rep_out = out;
      rep_dq.assign(size_t(rows * s.C), 0.0f);
      rep_dk.assign(gk.size(), 0.0f);
      rep_dv.assign(gk.size(), 0.0f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t d = 0; d < hd; ++d) {
            const size_t at = size_t(r * 3 * s.C + h * hd + d), kv = size_t(r * Ckv + (h / group) * hd + d);
            rep_dq[size_t(r * s.C + h * hd + d)] = dqkv[at];
            rep_dk[kv] += dqkv[at + size_t(s.C)];
            rep_dv[kv] += dqkv[at + size_t(2 * s.C)];
          }
    }
    auto gqa = [&](int t, auto& row) {
      auto run = [&](const char* kernel, auto tag, double tol) {
        using Elem = decltype(tag);
        auto to = [](const std::vector<float>& v) {
          std::vector<Elem> r(v.size());
          for (size_t i = 0; i < v.size(); ++i) store(r[i], v[i]);
          return r;
        };
        const std::vector<Elem> q = to(gq), k = to(gk), v = to(gv), dy = to(dout);
        std::vector<Elem> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
        const Timing ff = time_per_call([&] {
          cpu::flash_attention_gqa_forward(q.data(), k.data(), v.data(), s.C, Ckv, out.data(), lse.data(), s.B, s.T,
                                           s.H, KV, hd);
        });
        const Timing fb = time_per_call([&] {
          cpu::flash_attention_gqa_backward(dy.data(), q.data(), k.data(), v.data(), s.C, Ckv, out.data(), lse.data(),
                                            dq.data(), dk.data(), dv.data(), s.B, s.T, s.H, KV, hd);
        });
        const double err = std::max({relative_error(widen(out), rep_out), relative_error(widen(dq), rep_dq),
                                     relative_error(widen(dk), rep_dk), relative_error(widen(dv), rep_dv)});
        row(kernel, t, ff, fb, err, tol);
      };
      run("gqa f32", float{}, 1e-5);
      run("gqa bf16", bf16{}, 1e-2);
    };
    for (int t : threads) {
      cpu::set_threads(t);
      // Reference: scalar loops over the stored probabilities.
      const Timing rf = time_per_call([&] { cpu::attention_forward(qkv.data(), att.data(), ref_out.data(), s.B, s.T, s.C, s.H); });
      const Timing rb = time_per_call([&] {
        cpu::attention_backward(dout.data(), qkv.data(), att.data(), ref_dqkv.data(), s.B, s.T, s.C, s.H);
      });
      row("ref f32", t, rf, rb, -1.0, 0.0);

      auto flash = [&](const char* kernel, const auto& q, const auto& dy, double tol) {
        using Elem = std::decay_t<decltype(q[0])>;
        std::vector<Elem> out(size_t(rows * s.C)), dqkv(q.size());
        const Timing ff = time_per_call(
            [&] { cpu::flash_attention_forward(q.data(), out.data(), lse.data(), s.B, s.T, s.C, s.H); });
        const Timing fb = time_per_call([&] {
          cpu::flash_attention_backward(dy.data(), q.data(), out.data(), lse.data(), dqkv.data(), s.B, s.T, s.C, s.H);
        });
        const double err = std::max(relative_error(widen(out), ref_out), relative_error(widen(dqkv), ref_dqkv));
        row(kernel, t, ff, fb, err, tol);
      };
      flash("flash f32", qkv, dout, 1e-5);
      flash("flash bf16", qkv16, dout16, 1e-2);
      if (s.H % 4 == 0) gqa(t, row);
    }
  }
}
