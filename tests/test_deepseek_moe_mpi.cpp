// DeepSeek-V3's MoE layer (model/moe.hpp: sigmoid scores, a bias-corrected group-limited top-k, renormalised and
// scaled weights, two shared experts, the per-sequence load-balancing loss) keeps Relay's guarantee on its own, before
// any family uses it: under expert parallelism (2 real ranks, each routing its own sequences and holding 4 of the 8
// experts, the shared experts replicated) and tensor parallelism (2 real ranks, every expert's and the shared experts'
// SwiGLU units split) and context parallelism (2 real ranks, each holding half of every sequence's rows: a sequence's
// load-balancing statistics summed over both) the output, the input's gradient, every weight's gradient, the routing
// and the aux loss equal the serial run's. tests/torch/moe_layer.cpp runs the layer (serially, or under mpirun and gathered on rank 0).
// Whole-model layouts (pp, ZeRO, cp) are the deepseek_v3 family's to test.
//
// Top-k routing is discontinuous: the serial run's smallest choice margin is asserted above 1e-4, so a failure here
// is never two correct layouts routing a near-tie differently. Tolerance: |a - b| <= 1e-5 x the largest |b| of the
// tensor (the layouts sum a gradient's terms in another order: its rounding is relative to the terms, not to a sum
// that cancels to near zero).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/rng.hpp"
#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr int64_t kN = 32, kT = 8, kC = 16, kE = 8, kK = 3, kF = 12, kGroups = 4, kTopGroups = 2, kShared = 2;

// The layer's input file (moe_layer.cpp's format): random weights and inputs, a non-zero correction bias.
void write_input(const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  const int64_t header[12] = {kN, kT, kC, kE, kK, kF, kGroups, kTopGroups, 1, kShared, 1, 1};
  const double reals[2] = {2.5, 0.05};  // routed_scaling_factor, the aux loss's weight per sequence
  f.write(reinterpret_cast<const char*>(header), sizeof(header));
  f.write(reinterpret_cast<const char*>(reals), sizeof(reals));
  relay::Rng rng(11, 3);
  auto normal = [&](int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = float(rng.normal()) * scale;
      f.write(reinterpret_cast<const char*>(&v), sizeof(v));
    }
  };
  const int64_t Fs = kShared * kF;
  normal(2 * kN * kC, 1.f);   // x, dy (n, C)
  normal(kE * kC, 0.3f);      // router (E, C)
  normal(kE, 0.05f);          // e_score_correction_bias (E)
  normal(3 * Fs * kC, 0.3f);  // shared gate, up (Fs, C), down (C, Fs)
  normal(3 * kE * kF * kC, 0.3f);  // every expert's gate, up (F, C), down (C, F)
}

struct Output {
  std::vector<float> values;     // y, dx, then every gradient (moe_layer.cpp's order)
  std::vector<int32_t> experts;  // (n, k)
  double aux = 0, margin = 0;
};

Output read_output(const std::string& path) {
  const std::string raw = read_file(path);
  const int64_t Fs = kShared * kF;
  const size_t floats = size_t(2 * kN * kC + kE * kC + 3 * Fs * kC + 3 * kE * kF * kC), ints = size_t(kN * kK);
  EXPECT_EQ(raw.size(), 4 * floats + 4 * ints + 16) << path;
  Output o;
  if (raw.size() != 4 * floats + 4 * ints + 16) return o;
  o.values.resize(floats);
  o.experts.resize(ints);
  std::memcpy(o.values.data(), raw.data(), 4 * floats);
  std::memcpy(o.experts.data(), raw.data() + 4 * floats, 4 * ints);
  std::memcpy(&o.aux, raw.data() + 4 * (floats + ints), 8);
  std::memcpy(&o.margin, raw.data() + 4 * (floats + ints) + 8, 8);
  return o;
}

Output run_layer(const std::string& dir, const std::string& layout) {
  const std::string out = dir + "/out_" + (layout.empty() ? "serial" : layout) + ".bin";
  std::string cmd = std::string(RELAY_MOE_LAYER) + " " + dir + "/in.bin " + out;
  if (!layout.empty())
    cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(RELAY_MPIEXEC) +
          " --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 " + cmd + " " + layout;
  const RunResult r = run_command(cmd, 120);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  return read_output(out);
}

class DeepseekMoeLayout : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_input(dir_->path() + "/in.bin");
    serial_ = new Output(run_layer(dir_->path(), ""));
  }
  static void TearDownTestSuite() {
    delete serial_;
    delete dir_;
  }
  static TempDir* dir_;
  static Output* serial_;
};
TempDir* DeepseekMoeLayout::dir_ = nullptr;
Output* DeepseekMoeLayout::serial_ = nullptr;

TEST_P(DeepseekMoeLayout, EqualsSerial) {
  const Output& want = *serial_;
  ASSERT_FALSE(want.values.empty());
  EXPECT_GT(want.margin, 1e-4) << "the serial run's routing has a near-tie: choose other inputs";
  std::printf("serial run: smallest routing margin %.2e, aux %.6f\n", want.margin, want.aux);
  EXPECT_GT(want.aux, 0);
  const Output got = run_layer(dir_->path(), GetParam());
  ASSERT_EQ(got.values.size(), want.values.size());
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_NEAR(got.aux, want.aux, 1e-5 * want.aux);
  // The tensors' sizes in the file: y, dx, the router, the shared gate, up and down, every expert's gate, up and down.
  const int64_t Fs = kShared * kF;
  std::vector<int64_t> sizes{kN * kC, kN * kC, kE * kC, Fs * kC, Fs * kC, kC * Fs};
  for (int64_t i = 0; i < 3 * kE; ++i) sizes.push_back(kF * kC);
  int bad = 0;
  double nonzero = 0;
  size_t at = 0;
  for (size_t t = 0; t < sizes.size(); at += size_t(sizes[t++])) {
    double scale = 0;
    for (int64_t i = 0; i < sizes[t]; ++i) scale = std::max(scale, std::abs(double(want.values[at + size_t(i)])));
    for (size_t i = at; i < at + size_t(sizes[t]); ++i) {
      const double a = got.values[i], b = want.values[i];
      nonzero += b != 0;
      if (!(std::abs(a - b) <= 1e-5 * scale) && ++bad <= 10)
        ADD_FAILURE() << GetParam() << ": tensor " << t << ", value " << i - at << " is " << a << ", serially " << b
                      << " (the tensor's largest magnitude " << scale << ")";
    }
  }
  EXPECT_EQ(at, want.values.size());
  EXPECT_EQ(bad, 0);
  EXPECT_GT(nonzero, 0.5 * double(want.values.size()));  // the gradients are not all zero
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeepseekMoeLayout, ::testing::Values("ep", "tp", "cp"),
                         [](const auto& info) { return info.param + std::string("2"); });

}  // namespace
