// The machine's fp32 GEMM peak through oneDNN (the reference for the CPU targets), on the benchmark
// MLP's shapes and a large square one. Measures; never fails. Usage: bench_gemm [threads ...]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

int main(int argc, char** argv) {
  std::vector<int> threads;
  for (int i = 1; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
  if (threads.empty()) threads = {1, 2};
  struct Shape { const char* what; bool ta, tb; int64_t m, n, k; };
  const Shape shapes[] = {{"square 4096", false, false, 4096, 4096, 4096},
                          {"forward  x W^T (256,4096)x(4096,4096)^T", false, true, 256, 4096, 4096},
                          {"backward dy W  (256,4096)x(4096,4096)", false, false, 256, 4096, 4096},
                          {"weight  dy^T x (4096,256)x(256,4096)", true, false, 4096, 4096, 256}};
  std::printf("%-44s %8s %10s %10s\n", "gemm (m x n x k)", "threads", "ms", "GFLOP/s");
  for (const Shape& s : shapes) {
    std::vector<float> a(size_t(s.m * s.k), 0.5f), b(size_t(s.k * s.n), 0.25f), c(size_t(s.m * s.n));
    for (int t : threads) {
      relay::cpu::set_threads(t);
      auto run = [&] {
        relay::cpu::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), s.ta ? s.m : s.k, b.data(), s.tb ? s.k : s.n, 0.f,
                         c.data(), s.n);
      };
      run();
      const int reps = s.m * s.n * s.k > 20'000'000'000LL ? 3 : 10;
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) run();
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      bool ok = c[0] == float(0.125 * double(s.k));  // every product is 0.5 x 0.25
      std::printf("%-44s %8d %10.2f %10.1f %s\n", s.what, t, sec * 1e3, 2.0 * s.m * s.n * s.k / sec / 1e9,
                  ok ? "ok" : "WRONG");
    }
  }
}
