// GPT models keep Relay's guarantee: every layout gives the serial run's result up to floating-point
// reordering. The real binary trains a 4-layer GPT (6 blocks: embedding, 4 transformer blocks, head)
// on a token file for 6 steps under mpirun, over every schedule and several layouts, including an
// uneven split, pp = n_layer, and tied embeddings split across the first and last stage (whose two
// copies the run itself checks bitwise after every step: RELAY_VERIFY_TIED=1). Every step's loss
// and every final tensor (parameters and AdamW state) is compared with the serial run.
//
// Tolerance: |a - b| <= 1e-6 + 1e-5 |b|, as for the MLP (tests/test_equivalence_mpi.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case;
void PrintTo(const Case& c, std::ostream* os);

struct Case {
  std::string model;  // "tied" (default), "untied", "nobias"
  int dp, pp;
  std::string schedule;
  int m;
  std::string balance;  // "" = by FLOPs
  std::string name() const {
    std::string s = model + "_dp" + std::to_string(dp) + "_pp" + std::to_string(pp) + "_" + schedule + "_m" +
                    std::to_string(m) + (balance.empty() ? "" : "_uneven");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<std::string> model_overrides(const std::string& model) {
  if (model == "untied") return {"model.tie_embeddings=false"};
  if (model == "nobias") return {"model.bias=false"};
  return {};
}

std::vector<Case> all_cases() {
  std::vector<Case> out = {
      {"tied", 2, 1, "1f1b", 2, ""},        {"tied", 4, 1, "gpipe", 1, ""},
      {"tied", 1, 2, "gpipe", 4, ""},       {"tied", 1, 2, "1f1b", 4, ""},
      {"tied", 1, 2, "zb-h1", 4, ""},       {"tied", 1, 2, "interleaved", 4, ""},
      {"tied", 2, 2, "1f1b", 2, ""},        {"tied", 2, 2, "zb-h1", 4, ""},
      {"tied", 1, 4, "1f1b", 4, ""},        {"tied", 1, 4, "zb-h1", 8, ""},  // pp = n_layer
      {"tied", 1, 3, "1f1b", 4, "[1, 3, 2]"},                                // uneven split
      {"tied", 1, 3, "gpipe", 2, "[3, 2, 1]"},
      {"untied", 1, 2, "1f1b", 4, ""},      {"untied", 2, 2, "zb-h1", 2, ""},
      {"nobias", 1, 2, "1f1b", 2, ""},      {"nobias", 2, 1, "1f1b", 2, ""},
  };
  return out;
}

class GptEquivalence : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    setenv("RELAY_VERIFY_TIED", "1", 1);  // every run checks its tied copies bitwise after each step
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    for (std::string model : {"tied", "untied", "nobias"})
      serial_[model] = train_and_record(1, problem_.config, model_overrides(model), dir_->file("serial_" + model));
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, RunRecord> serial_;  // by model variant
};
std::unique_ptr<TempDir> GptEquivalence::dir_;
Problem GptEquivalence::problem_;
std::map<std::string, RunRecord> GptEquivalence::serial_;

TEST_P(GptEquivalence, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_[c.model].losses.size(), 6u);
  auto ov = model_overrides(c.model);
  ov.insert(ov.end(), {"parallel.dp=" + std::to_string(c.dp),
                       "parallel.pp=" + std::to_string(c.pp), "parallel.schedule=\"" + c.schedule + "\"",
                       "train.micro_batches=" + std::to_string(c.m),
                       "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1)});
  if (!c.balance.empty()) ov.push_back("parallel.balance=" + c.balance);
  RunResult r;
  const RunRecord got =
      train_and_record(c.dp * c.pp, problem_.config, ov, dir_->file(c.name()), "step_00000006.h5", &r);
  ASSERT_EQ(r.exit_code, 0);
  if (c.model != "untied" && c.pp > 1) {
    EXPECT_TRUE(contains(r.output, "transformer.wte.weight is tied across pipeline ranks 0 and " +
                                       std::to_string(c.pp - 1)))
        << r.output;
  }
  expect_run_matches(got, serial_[c.model], kRel, kAbs, "against the serial run");
}

INSTANTIATE_TEST_SUITE_P(Layouts, GptEquivalence, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(GptDeterminism, TwoRunsOfOneLayoutAreBitwiseIdentical) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  std::vector<std::map<std::string, std::vector<float>>> results;
  std::vector<std::vector<double>> losses;
  for (int k = 0; k < 2; ++k) {
    std::string run = dir.file("run" + std::to_string(k));
    RunResult r = train(4, p.config, {"run.dir=\"" + run + "\"", "parallel.dp=2", "parallel.pp=2",
                                      "parallel.schedule=\"1f1b\"", "train.micro_batches=2"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    results.push_back(read_checkpoint(run + "/checkpoints/step_00000006.h5"));
    losses.push_back(read_losses(run));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(results[0] == results[1]) << "final tensors differ between two identical runs";
}

// The loss starts at about ln(vocab) (uniform predictions from a 0.02-std initialisation) and falls.
TEST(GptTraining, LossStartsNearLnVocabAndFalls) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  std::string run = dir.file("run");
  RunResult r = train(1, p.config, {"run.dir=\"" + run + "\"", "train.steps=40", "lr_schedule.warmup_steps=0",
                                     "optimizer.lr=0.01", "lr_schedule.min_lr=0.001"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto losses = read_losses(run);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses.front(), std::log(96.0), 0.1);
  EXPECT_LT(losses.back(), losses.front() - 0.5);
  EXPECT_TRUE(contains(r.output, "tokens/s")) << r.output;
  EXPECT_TRUE(contains(r.output, "eval loss")) << r.output;
}

}  // namespace
