// Optimizer updates, learning-rate schedules and clipping against values computed by hand from the
// PyTorch formulas (torch.optim.AdamW, torch.optim.SGD, torch.nn.utils.clip_grad_norm_).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "optim/optimizer.hpp"

using namespace relay;

TEST(AdamW, TwoStepsByHand) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01; p0 = 1, g1 = 0.5, g2 = -0.25.
  float p = 1.f, m = 0.f, v = 0.f;
  float g1 = 0.5f, g2 = -0.25f;
  cpu::adamw_step(&p, &g1, &m, &v, nullptr, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 1);
  // step 1: p = 1 * (1 - 0.001) = 0.999; m = 0.05; v = 0.00025; mhat = 0.5, vhat = 0.25 -> p -= 0.1 * 0.5 / (0.5 + 1e-8)
  double p1 = 0.999 - 0.1 * 0.05 / 0.1 / (std::sqrt(0.00025) / std::sqrt(0.001) + 1e-8);
  EXPECT_NEAR(p, p1, 1e-6);
  EXPECT_NEAR(m, 0.05, 1e-7);
  EXPECT_NEAR(v, 0.00025, 1e-10);
  cpu::adamw_step(&p, &g2, &m, &v, nullptr, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 2);
  double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.999 * 0.00025 + 0.001 * 0.0625;
  double bc1 = 1 - 0.81, bc2 = 1 - 0.999 * 0.999;
  double p2 = p1 * (1 - 0.001) - (0.1 / bc1) * m2 / (std::sqrt(v2) / std::sqrt(bc2) + 1e-8);
  EXPECT_NEAR(p, p2, 1e-6);
  EXPECT_NEAR(m, m2, 1e-7);
  EXPECT_NEAR(v, v2, 1e-10);
}

// adamw_step_many (one parallel pass over every tensor's elements, the optimizer's step) equals adamw_step on each
// tensor bit for bit: tensors below and above the one-tensor loop's parallel threshold, odd sizes (vector tails cut
// anywhere by the threads' ranges), with and without a bf16 working copy, 2 threads, three steps.
TEST(AdamW, ManyTensorsInOnePassEqualEachTensorsStep) {
  auto be = make_backend(BackendOptions{Device::cpu, 2, 0, Precision::fp32});
  const std::vector<int64_t> sizes = {1, 7, 8191, 8193, 33, 40000, 5, 16385};
  struct State { Tensor p, g, m, v, w; };
  std::vector<State> one, many;
  uint32_t seed = 1;
  auto rnd = [&] { seed = seed * 1664525u + 1013904223u; return float(int32_t(seed >> 8) - (1 << 23)) / float(1 << 23); };
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> p(sizes[k]), g(sizes[k]);
    for (auto& x : p) x = rnd();
    for (auto& x : g) x = rnd() * 1e-2f;
    for (auto* s : {&one, &many}) {
      State t{Tensor(*be, {sizes[k]}), Tensor(*be, {sizes[k]}), Tensor(*be, {sizes[k]}), Tensor(*be, {sizes[k]}),
              k % 2 ? Tensor(*be, {sizes[k]}, DType::bf16) : Tensor()};
      be->upload(t.p, p.data());
      be->upload(t.g, g.data());
      be->fill(t.m, 0.f);
      be->fill(t.v, 0.f);
      s->push_back(std::move(t));
    }
  }
  std::vector<Backend::AdamWSlot> slots;
  for (State& t : many) slots.push_back({&t.p, &t.g, &t.m, &t.v, &t.w});
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWArgs a{1e-2, 0.9, 0.95, 1e-8, 0.1, step};
    for (State& t : one) be->adamw_step(t.p, t.g, t.m, t.v, a, t.w);
    be->adamw_step_many(slots, a);
  }
  auto bits = [&](const Tensor& t) {
    std::vector<uint16_t> out(t.bytes() / 2);
    be->download(out.data(), t);
    return out;
  };
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(bits(one[k].p), bits(many[k].p)) << "param " << k << " (" << sizes[k] << " elements)";
    EXPECT_EQ(bits(one[k].m), bits(many[k].m)) << "exp_avg " << k;
    EXPECT_EQ(bits(one[k].v), bits(many[k].v)) << "exp_avg_sq " << k;
    if (one[k].w.defined()) EXPECT_EQ(bits(one[k].w), bits(many[k].w)) << "work " << k;
  }
}

TEST(Sgd, MomentumAndWeightDecayByHand) {
  // torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.1): buf = d at the first step.
  float p = 2.f, buf = 123.f, g1 = 1.f, g2 = -1.f;
  cpu::sgd_step(&p, &g1, &buf, nullptr, 1, 0.1f, 0.9f, 0.1f, true);
  double d1 = 1 + 0.1 * 2, p1 = 2 - 0.1 * d1;
  EXPECT_NEAR(buf, d1, 1e-6);
  EXPECT_NEAR(p, p1, 1e-6);
  cpu::sgd_step(&p, &g2, &buf, nullptr, 1, 0.1f, 0.9f, 0.1f, false);
  double d2 = -1 + 0.1 * p1, b2 = 0.9 * d1 + d2, p2 = p1 - 0.1 * b2;
  EXPECT_NEAR(buf, b2, 1e-6);
  EXPECT_NEAR(p, p2, 1e-6);
  float q = 1.f, g = 0.5f;  // momentum 0: plain p -= lr (g + wd p), no buffer touched
  cpu::sgd_step(&q, &g, nullptr, nullptr, 1, 0.2f, 0.f, 0.f, true);
  EXPECT_NEAR(q, 0.9, 1e-7);
}

TEST(LrSchedule, ConstantAndCosine) {
  Config::LrSchedule c{"constant", 0, 0};
  EXPECT_DOUBLE_EQ(learning_rate(c, 0.1, 1, 100), 0.1);
  Config::LrSchedule s{"cosine", 10, 0.001};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 1, 110), 0.01);   // linear warm-up: lr * 1/10
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 10, 110), 0.1);   // end of warm-up
  EXPECT_NEAR(learning_rate(s, 0.1, 60, 110), 0.001 + 0.5 * 0.099, 1e-12);  // half-way: the mean
  EXPECT_NEAR(learning_rate(s, 0.1, 110, 110), 0.001, 1e-12);               // min_lr at the last step
  Config::LrSchedule nowarm{"cosine", 0, 0.0};
  EXPECT_NEAR(learning_rate(nowarm, 1.0, 1, 4), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
}

TEST(Clip, TorchClipGradNormSemantics) {
  EXPECT_DOUBLE_EQ(clip_factor(10.0, 0.0), 1.0);                // off
  EXPECT_DOUBLE_EQ(clip_factor(0.5, 1.0), 1.0);                 // below the max: unchanged
  EXPECT_NEAR(clip_factor(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);  // max / (norm + 1e-6)
}
