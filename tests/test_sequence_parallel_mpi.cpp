// Sequence parallelism (parallel.sequence_parallel, model/tensor_parallel.hpp) keeps Relay's guarantee: every layout
// gives the serial run's result up to floating-point reordering. The real binary trains the GPT problem's 4-layer
// GPT and its Llama twin (8 query heads, 4 key/value heads) for 6 steps under mpirun on tp 2 and tp 4, with and
// without sequence parallelism, and with it beside dp, pp (1F1B, ZB-H1), cp, ZeRO-1, recomputation and document
// masks. Every step's loss and gradient norm and every final tensor (parameters and AdamW state, so the norm
// weights' moments: their gradients) is compared with the serial run. Without the norm-weight gradients' sum over
// the tp group each rank would see 1/tp of the rows: the gradient norm and the norms' moments would differ.
// Measured activation memory per rank is below the tp-only run's and equal to relay plan's prediction; bad settings
// are named.
//
// Tolerance: |a - b| <= 1e-6 + 1e-5 |b|, as for the other equivalence tests.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/rng.hpp"
#include "io/token_dataset.hpp"
#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case {
  std::string model;  // "gpt" or "llama"
  bool sp = true;     // parallel.sequence_parallel
  int tp = 2, dp = 1, pp = 1, cp = 1;
  std::string schedule = "1f1b";
  int m = 1;
  bool zero = false, recompute = false, docs = false;
  int ranks() const { return dp * cp * tp * pp; }
  std::string key() const { return model + (docs ? "_docs" : ""); }
  std::string name() const {
    std::string s = key() + (sp ? "_sp" : "_nosp") + "_tp" + std::to_string(tp) + "_dp" + std::to_string(dp) +
                    "_pp" + std::to_string(pp) + "_cp" + std::to_string(cp) + "_" + schedule + "_m" +
                    std::to_string(m) + (zero ? "_zero" : "") + (recompute ? "_recompute" : "");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<std::string> model_overrides(const std::string& model) {
  if (model == "gpt") return {"model.n_head=4"};  // 4 heads of 4 (tp 4 holds one each)
  return {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8", "model.n_kv_head=4", "model.ffn_hidden=48",
          "model.rope_theta=500.0", "model.norm_eps=1e-6"};
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  auto add = [&](Case c) { out.push_back(std::move(c)); };
  add({"gpt", true, 2});
  add({"gpt", false, 4});
  add({"gpt", true, 4});
  add({"llama", true, 2});
  add({"llama", false, 4});
  add({"llama", true, 4});
  // Compositions: dp x tp x pp with ZeRO-1 and recomputation; ZB-H1's separate weight step; tp x cp with documents.
  add({"gpt", true, 2, 2, 2, 1, "1f1b", 2, /*zero=*/true, /*recompute=*/true});
  add({"llama", true, 2, 1, 2, 1, "zb-h1", 4});
  add({"llama", true, 2, 1, 1, 2, "1f1b", 2, false, false, /*docs=*/true});
  return out;
}

class SequenceParallel : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    write_documents(dir_->file("docs.h5"));
    write_documents(dir_->file("docs_eval.h5"), 8, 1025);
    for (const auto& [model, docs] : std::vector<std::pair<std::string, bool>>{{"gpt", false}, {"llama", false},
                                                                              {"llama", true}}) {
      const std::string key = model + (docs ? "_docs" : ""), run = dir_->file("serial_" + key);
      RunResult r = train(1, problem_.config, overrides(model, docs, run));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      serial_losses_[key] = read_losses(run);
      serial_norms_[key] = read_grad_norms(run);
      serial_tensors_[key] = read_checkpoint(run + "/checkpoints/step_00000006.h5");
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::vector<std::string> overrides(const std::string& model, bool docs, const std::string& run) {
    auto ov = model_overrides(model);
    ov.insert(ov.end(), {"run.dir=" + quoted(run), "train.log_every=1"});
    if (docs)
      ov.insert(ov.end(), {"data.train=" + quoted(dir_->file("docs.h5")),
                           "data.eval=" + quoted(dir_->file("docs_eval.h5")), "data.document_mask=true"});
    return ov;
  }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, std::vector<double>> serial_losses_, serial_norms_;
  static std::map<std::string, std::map<std::string, std::vector<float>>> serial_tensors_;
};
std::unique_ptr<TempDir> SequenceParallel::dir_;
Problem SequenceParallel::problem_;
std::map<std::string, std::vector<double>> SequenceParallel::serial_losses_, SequenceParallel::serial_norms_;
std::map<std::string, std::map<std::string, std::vector<float>>> SequenceParallel::serial_tensors_;

TEST_P(SequenceParallel, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_losses_[c.key()].size(), 6u);
  const std::string run = dir_->file(c.name());
  auto ov = overrides(c.model, c.docs, run);
  ov.insert(ov.end(), {"parallel.dp=" + std::to_string(c.dp), "parallel.cp=" + std::to_string(c.cp),
                       "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                       "parallel.schedule=" + quoted(c.schedule), "train.micro_batches=" + std::to_string(c.m),
                       std::string("parallel.sequence_parallel=") + (c.sp ? "true" : "false"),
                       std::string("optimizer.zero=") + (c.zero ? "true" : "false"),
                       std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\"")});
  RunResult r = train(c.ranks(), problem_.config, ov);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (c.sp) EXPECT_TRUE(contains(r.output, "sequence parallelism: ")) << r.output;
  const auto losses = read_losses(run), norms = read_grad_norms(run);
  const auto &ref = serial_losses_[c.key()], &ref_norms = serial_norms_[c.key()];
  ASSERT_EQ(losses.size(), ref.size());
  ASSERT_EQ(norms.size(), ref_norms.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(losses[i], ref[i], kAbs + kRel * std::abs(ref[i])) << "loss at step " << i + 1;
    EXPECT_NEAR(norms[i], ref_norms[i], kAbs + kRel * std::abs(ref_norms[i])) << "grad norm at step " << i + 1;
  }
  const auto got = read_checkpoint(run + "/checkpoints/step_00000006.h5");
  const auto& want = serial_tensors_[c.key()];
  expect_tensors_within(got, want, kRel, kAbs, "against the serial run");
  // The norm weights' AdamW moments, by name: the gradients the group's sum must restore.
  size_t norms_seen = 0;
  for (const auto& [name, values] : want)
    if ((contains(name, "ln_") || contains(name, "layernorm") || contains(name, "norm.weight")) &&
        contains(name, "exp_avg") && !contains(name, "exp_avg_sq")) {
      ++norms_seen;
      ASSERT_TRUE(got.count(name)) << name;
      double worst = 0;
      for (size_t i = 0; i < values.size(); ++i)
        worst = std::max(worst, std::abs(double(got.at(name)[i]) - values[i]) / (kAbs + kRel * std::abs(values[i])));
      EXPECT_LE(worst, 1.0) << name << ": the first moment of a norm weight's gradient differs from serial's";
    }
  EXPECT_GE(norms_seen, 5u) << "no norm-weight moments found in the checkpoint";
}

INSTANTIATE_TEST_SUITE_P(Layouts, SequenceParallel, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// Bad settings: one line naming the key, exit 1 on every rank.
TEST(SequenceParallelRuns, BadSettingsAreNamed) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  RunResult a = train(2, p.config, {"run.dir=" + quoted(dir.file("a")), "parallel.dp=2", "parallel.sequence_parallel=true"}, 60);
  EXPECT_EQ(a.exit_code, 1) << a.output;
  EXPECT_TRUE(contains(a.output, "parallel.sequence_parallel: = true needs parallel.tp > 1")) << a.output;
  EXPECT_EQ(count_of(a.output, "error:"), 1u) << a.output;
  // 18 tokens per sequence cannot be split over tp 4.
  auto ov = model_overrides("llama");
  ov.insert(ov.end(), {"run.dir=" + quoted(dir.file("b")), "parallel.tp=4", "parallel.sequence_parallel=true",
                       "model.block_size=18"});
  RunResult b = train(4, p.config, ov, 60);
  EXPECT_EQ(b.exit_code, 1) << b.output;
  EXPECT_TRUE(contains(b.output, "parallel.sequence_parallel: = true: model.block_size / parallel.cp = 18 tokens per rank "
                                 "must be divisible by parallel.tp = 4")) << b.output;
  EXPECT_EQ(count_of(b.output, "error:"), 1u) << b.output;
}

// Activation memory per rank under sequence parallelism is below the tp-only run's, and every rank's measured bytes
// equal relay plan's prediction (1%), for GPT and Llama at T 128, tp 2.
TEST(SequenceParallelRuns, ActivationMemoryBelowTensorParallelAsPlanned) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 8193, 96, 128);
  for (std::string model : {"gpt", "llama"}) {
    std::map<bool, double> activations;  // by sequence_parallel: rank 0's measured activation bytes
    for (bool sp : {false, true}) {
      const std::string run = dir.file(model + (sp ? "_sp" : "_tp"));
      auto ov = model_overrides(model);
      ov.insert(ov.end(), {"run.dir=" + quoted(run), "parallel.tp=2", "train.steps=2", "lr_schedule.warmup_steps=1",
                           "data.eval=\"\"", std::string("parallel.sequence_parallel=") + (sp ? "true" : "false")});
      RunResult r = train(2, p.config, ov);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      auto j = nlohmann::json::parse(read_file(run + "/memory.json"));
      ASSERT_EQ(j.at("bytes_per_rank").size(), 2u);
      for (auto& rank : j.at("bytes_per_rank"))
        for (const char* k : {"params", "grads", "optimizer", "activations"}) {
          const double got = rank.at("measured").at(k).get<double>(), want = rank.at("predicted").at(k).get<double>();
          EXPECT_NEAR(got, want, 0.01 * want + 1024) << model << " sp " << sp << " rank " << rank.at("rank") << " " << k;
        }
      activations[sp] = j.at("bytes_per_rank")[0].at("measured").at("activations").get<double>();
    }
    std::printf("%s activation bytes per rank at tp 2: %.0f, with sequence parallelism %.0f (%.2fx)\n", model.c_str(),
                activations[false], activations[true], activations[true] / activations[false]);
    EXPECT_LT(activations[true], 0.9 * activations[false]) << model;
  }
}

}  // namespace
