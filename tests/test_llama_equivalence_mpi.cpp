// Llama models keep Relay's guarantee: every layout gives the serial run's result up to floating-point
// reordering. The real binary trains a 4-layer Llama (6 blocks: embedding, 4 decoder layers, head) with
// grouped-query attention (8 query heads sharing 4 key/value heads, so tp = 4 holds 2 query heads and
// 1 key/value head per rank) on the GPT equivalence test's token file for 6 steps under mpirun, over
// every schedule, tp 1/2/4, ZeRO-1, recomputation, uneven stages and a tied embedding; multi-query
// attention (one key/value head) on dp x pp. Every step's loss and every final tensor (parameters and
// AdamW state) is compared with the serial run of the same model.
//
// Tolerance: |a - b| <= 1e-6 + 1e-5 |b|, as for the MLP and GPT.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case {
  std::string model;  // "gqa" (default), "mqa" (n_kv_head 1), "tied"
  int dp = 1, tp = 1, pp = 1;
  std::string schedule = "1f1b";
  int m = 1;
  std::string balance;  // "" = by FLOPs
  bool zero = false, recompute = false;
  int ranks() const { return dp * tp * pp; }
  std::string name() const {
    std::string s = model + "_dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) +
                    "_" + schedule + "_m" + std::to_string(m) + (balance.empty() ? "" : "_uneven") +
                    (zero ? "_zero" : "") + (recompute ? "_recompute" : "");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// The GPT problem's config made a Llama: 8 heads of 4 channels, 4 key/value heads, SwiGLU 48 wide.
std::vector<std::string> model_overrides(const std::string& model) {
  std::vector<std::string> ov = {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8", "model.ffn_hidden=48",
                                 "model.rope_theta=500.0", "model.norm_eps=1e-6"};
  ov.push_back(model == "mqa" ? "model.n_kv_head=1" : "model.n_kv_head=4");
  if (model == "tied") ov.push_back("model.tie_embeddings=true");
  return ov;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  auto add = [&](std::string model, int dp, int tp, int pp, std::string sched, int m, std::string balance = "",
                 bool zero = false, bool rec = false) {
    out.push_back({std::move(model), dp, tp, pp, std::move(sched), m, std::move(balance), zero, rec});
  };
  add("gqa", 2, 1, 1, "1f1b", 2);
  add("gqa", 1, 1, 2, "gpipe", 4);
  add("gqa", 1, 1, 2, "1f1b", 4);
  add("gqa", 1, 1, 2, "interleaved", 4);
  add("gqa", 1, 1, 2, "zb-h1", 4);
  add("gqa", 1, 1, 3, "1f1b", 4, "[1, 3, 2]");  // uneven stages
  add("gqa", 1, 2, 1, "1f1b", 1);
  add("gqa", 1, 4, 1, "1f1b", 2);
  add("gqa", 2, 2, 2, "1f1b", 2);                       // dp x tp x pp
  add("gqa", 2, 1, 2, "1f1b", 2, "", /*zero=*/true);
  add("gqa", 1, 2, 2, "interleaved", 4, "", false, /*recompute=*/true);
  add("gqa", 2, 2, 1, "1f1b", 2, "", true, true);
  add("mqa", 2, 1, 2, "zb-h1", 2);
  add("tied", 1, 1, 2, "1f1b", 4);
  add("tied", 1, 2, 2, "1f1b", 2);
  return out;
}

class LlamaEquivalence : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    setenv("RELAY_VERIFY_TIED", "1", 1);  // every run checks its tied copies bitwise after each step
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    for (std::string model : {"gqa", "mqa", "tied"}) {
      std::string run = dir_->file("serial_" + model);
      auto ov = model_overrides(model);
      ov.push_back("run.dir=\"" + run + "\"");
      RunResult r = train(1, problem_.config, ov);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      serial_losses_[model] = read_losses(run);
      serial_tensors_[model] = read_checkpoint(run + "/checkpoints/step_00000006.h5");
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, std::vector<double>> serial_losses_;
  static std::map<std::string, std::map<std::string, std::vector<float>>> serial_tensors_;
};
std::unique_ptr<TempDir> LlamaEquivalence::dir_;
Problem LlamaEquivalence::problem_;
std::map<std::string, std::vector<double>> LlamaEquivalence::serial_losses_;
std::map<std::string, std::map<std::string, std::vector<float>>> LlamaEquivalence::serial_tensors_;

TEST_P(LlamaEquivalence, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_losses_[c.model].size(), 6u);
  std::string run = dir_->file(c.name());
  auto ov = model_overrides(c.model);
  ov.insert(ov.end(), {"run.dir=\"" + run + "\"", "parallel.dp=" + std::to_string(c.dp),
                       "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                       "parallel.schedule=\"" + c.schedule + "\"", "train.micro_batches=" + std::to_string(c.m),
                       "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1),
                       std::string("optimizer.zero=") + (c.zero ? "true" : "false"),
                       std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\"")});
  if (!c.balance.empty()) ov.push_back("parallel.balance=" + c.balance);
  RunResult r = train(c.ranks(), problem_.config, ov);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (c.model == "tied" && c.pp > 1) {
    EXPECT_TRUE(contains(r.output, "model.embed_tokens.weight is tied across pipeline ranks")) << r.output;
  }
  auto losses = read_losses(run);
  const auto& ref = serial_losses_[c.model];
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(losses[i], ref[i], kAbs + kRel * std::abs(ref[i])) << "loss at step " << i + 1;
  auto tensors = read_checkpoint(run + "/checkpoints/step_00000006.h5");
  const auto& rt = serial_tensors_[c.model];
  ASSERT_EQ(tensors.size(), rt.size());
  expect_tensors_within(tensors, rt, kRel, kAbs, "against the serial run");
}

INSTANTIATE_TEST_SUITE_P(Layouts, LlamaEquivalence, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

// The parameters are exactly transformers' LlamaForCausalLM state_dict names and shapes.
TEST(LlamaModel, CheckpointHoldsTransformersNames) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  std::string run = dir.file("run");
  auto ov = model_overrides("gqa");
  ov.insert(ov.end(), {"run.dir=\"" + run + "\"", "train.steps=1", "lr_schedule.warmup_steps=0"});
  RunResult r = train(1, p.config, ov);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto t = read_checkpoint(run + "/checkpoints/step_00000001.h5");
  const std::map<std::string, size_t> want = {
      {"model/model.embed_tokens.weight", 96 * 32},
      {"model/model.layers.0.input_layernorm.weight", 32},
      {"model/model.layers.0.self_attn.q_proj.weight", 32 * 32},
      {"model/model.layers.0.self_attn.k_proj.weight", 16 * 32},
      {"model/model.layers.0.self_attn.v_proj.weight", 16 * 32},
      {"model/model.layers.0.self_attn.o_proj.weight", 32 * 32},
      {"model/model.layers.0.post_attention_layernorm.weight", 32},
      {"model/model.layers.0.mlp.gate_proj.weight", 48 * 32},
      {"model/model.layers.0.mlp.up_proj.weight", 48 * 32},
      {"model/model.layers.0.mlp.down_proj.weight", 32 * 48},
      {"model/model.layers.3.mlp.down_proj.weight", 32 * 48},
      {"model/model.norm.weight", 32},
      {"model/lm_head.weight", 96 * 32}};
  for (auto& [name, numel] : want) {
    auto it = t.find(name);
    ASSERT_NE(it, t.end()) << name << " missing from the checkpoint";
    EXPECT_EQ(it->second.size(), numel) << name;
  }
  size_t model_tensors = 0;
  for (auto& [name, v] : t) model_tensors += name.rfind("model/", 0) == 0;
  EXPECT_EQ(model_tensors, 2u + 9u * 4u + 1u);  // embed, 4 x 9 per layer, norm, lm_head
}

// Bad keys: one line naming the key, exit 1 on every rank.
TEST(LlamaModel, BadKeysAreNamed) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  struct Bad {
    std::vector<std::string> ov;
    int ranks;
    std::string msg;
  };
  const std::vector<Bad> bad = {
      {{"model.n_kv_head=3"}, 1, "model.n_kv_head: = 3 must divide model.n_head = 8"},
      {{"parallel.tp=8", "model.n_kv_head=4"}, 8, "parallel.tp: = 8 must divide model.n_kv_head = 4"},
      {{"model.bias=false"}, 2, "model.bias"},
      {{"model.n_kv_head=2", "model.n_embd=24", "model.n_head=8"}, 1, "rotary embeddings need an even head size"},
  };
  for (const Bad& b : bad) {
    auto ov = model_overrides("gqa");
    ov.insert(ov.end(), b.ov.begin(), b.ov.end());
    ov.push_back("run.dir=\"" + dir.file("bad") + "\"");
    RunResult r = train(b.ranks, p.config, ov);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, b.msg)) << r.output;
  }
}

}  // namespace
