// FP8 GEMM rate on the GPU against bf16 (issue 43's target: cuBLASLt FP8 >= 1.7x its bf16 rate at 8192^3 on an
// H100): Backend::matmul in bf16 and Backend::fp8_matmul on operands quantised beforehand, tensorwise (e4m3 x e4m3,
// and the input gradient's e5m2 x e4m3) and blockwise (DeepSeek-V3's 1 x 128 x 128 x 128 and the weight
// gradient's 1 x 128 x 1 x 128), in the three orientations of a linear layer's GEMMs: forward x W^T (what cuBLASLt
// takes as it is), input gradient dy W (W copied transposed first), weight gradient dy^T x (both copied). The copies
// and scale relayouts are inside the timed FP8 calls; quantisation is not. Measures; never fails.
// TFLOP/s = 2 m n k / s. Correctness column: max |y - y_bf16| / max |y_bf16| (FP8's own rounding: a few percent).
// Usage: bench_fp8_gemm [size (8192)] [reps (20)] [cpu]; RELAY_FP8_GEMM=plain times the plain kernel instead
// (slow); "cpu": the CPU emulation (a dry run of the bench at a small size).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/bf16.hpp"
#include "core/rng.hpp"

using namespace relay;

namespace {

std::vector<double> values(Backend& be, const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  if (t.dtype() == DType::bf16) {
    std::vector<bf16> h(v.size());
    be.download(h.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(h[i]);
  } else {
    std::vector<float> h(v.size());
    be.download(h.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = h[i];
  }
  return v;
}

Tensor random_bf16(Backend& be, int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<bf16> h(size_t(rows * cols));
  Rng rng(seed, 0);
  for (bf16& x : h) x = f32_to_bf16(float(rng.uniform(-1.0, 1.0)));
  Tensor t(be, {rows, cols}, DType::bf16);
  be.upload(t, h.data());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t S = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  const bool cpu = argc > 3 && std::string(argv[3]) == "cpu";
  if (!cpu && cuda_device_count() == 0) {
    std::printf("bench_fp8_gemm: no CUDA device; nothing measured\n");
    return 0;
  }
  auto be = make_backend(BackendOptions{cpu ? Device::cpu : Device::cuda, 1, 0, Precision::bf16});
  std::printf("# %s; m = n = k = %lld, %d reps each; RELAY_FP8_GEMM=%s\n", be->describe().c_str(),
              static_cast<long long>(S), reps, std::getenv("RELAY_FP8_GEMM") ? std::getenv("RELAY_FP8_GEMM") : "(auto)");
  std::printf("%-22s %-26s %10s %10s %8s %12s\n", "gemm", "operands", "ms", "TFLOP/s", "x bf16", "rel_diff");
  struct Orientation { const char* name; bool ta, tb; };
  for (const Orientation o : {Orientation{"forward x W^T", false, true}, Orientation{"input grad dy W", false, false},
                              Orientation{"weight grad dy^T x", true, false}}) {
    // a stored (k, m) when ta, b stored (n, k) when tb; all square here.
    Tensor a = random_bf16(*be, S, S, 1), b = random_bf16(*be, S, S, 2);
    Tensor y_ref(*be, {S, S}, DType::bf16), y(*be, {S, S}, DType::bf16);
    auto time = [&](auto&& gemm) {
      gemm();
      be->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) gemm();
      be->synchronize();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    const double flops = 2.0 * double(S) * double(S) * double(S);
    const double t_bf16 = time([&] { be->matmul(a, o.ta, b, o.tb, y_ref, 1.f, 0.f); });
    std::printf("%-22s %-26s %10.3f %10.1f %8.2f %12s\n", o.name, "bf16 x bf16", t_bf16 * 1e3, flops / t_bf16 / 1e12,
                1.0, "-");
    const std::vector<double> ref = values(*be, y_ref);
    double ref_max = 0;
    for (double v : ref) ref_max = std::max(ref_max, std::fabs(v));
    struct Recipe { const char* name; Fp8Tiling at, bt; DType aq, bq; };
    const Fp8Tiling a_tiles = o.ta ? Fp8Tiling::col_128x1 : Fp8Tiling::row_1x128;
    const Fp8Tiling b_vec = o.tb ? Fp8Tiling::row_1x128 : Fp8Tiling::col_128x1;
    for (const Recipe r : {Recipe{"tensorwise e4m3 x e4m3", Fp8Tiling::tensor, Fp8Tiling::tensor, DType::fp8_e4m3, DType::fp8_e4m3},
                           Recipe{"tensorwise e5m2 x e4m3", Fp8Tiling::tensor, Fp8Tiling::tensor, DType::fp8_e5m2, DType::fp8_e4m3},
                           Recipe{"blockwise 1x128 x 128x128", a_tiles, Fp8Tiling::block_128x128, DType::fp8_e4m3, DType::fp8_e4m3},
                           Recipe{"blockwise 1x128 x 1x128", a_tiles, b_vec, DType::fp8_e4m3, DType::fp8_e4m3}}) {
      const Fp8Grid ga = fp8_grid(r.at, S, S), gb = fp8_grid(r.bt, S, S);
      Tensor aq(*be, {S, S}, r.aq), bq(*be, {S, S}, r.bq);                         // codes
      Tensor as(*be, {ga.rows, ga.cols}), bs(*be, {gb.rows, gb.cols});             // f32 scales
      be->fp8_quantize(a, r.at, aq, as);
      be->fp8_quantize(b, r.bt, bq, bs);
      const double t = time([&] { be->fp8_matmul(aq, as, r.at, o.ta, bq, bs, r.bt, o.tb, y, 0.f); });
      const std::vector<double> got = values(*be, y);
      double diff = 0;
      for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::fabs(got[i] - ref[i]));
      std::printf("%-22s %-26s %10.3f %10.1f %8.2f %12.2e\n", o.name, r.name, t * 1e3, flops / t / 1e12, t_bf16 / t,
                  diff / ref_max);
    }
  }
}
