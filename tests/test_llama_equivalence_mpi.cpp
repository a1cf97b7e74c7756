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

#include <nlohmann/json.hpp>

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
    for (std::string model : {"gqa", "mqa", "tied"})
      serial_[model] = train_and_record(1, problem_.config, model_overrides(model), dir_->file("serial_" + model));
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, RunRecord> serial_;  // by model variant
};
std::unique_ptr<TempDir> LlamaEquivalence::dir_;
Problem LlamaEquivalence::problem_;
std::map<std::string, RunRecord> LlamaEquivalence::serial_;

TEST_P(LlamaEquivalence, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_[c.model].losses.size(), 6u);
  auto ov = model_overrides(c.model);
  ov.insert(ov.end(), {"parallel.dp=" + std::to_string(c.dp),
                       "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
                       "parallel.schedule=\"" + c.schedule + "\"", "train.micro_batches=" + std::to_string(c.m),
                       "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1),
                       std::string("optimizer.zero=") + (c.zero ? "true" : "false"),
                       std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\"")});
  if (!c.balance.empty()) ov.push_back("parallel.balance=" + c.balance);
  RunResult r;
  const RunRecord got = train_and_record(c.ranks(), problem_.config, ov, dir_->file(c.name()), "step_00000006.h5", &r);
  ASSERT_EQ(r.exit_code, 0);
  if (c.model == "tied" && c.pp > 1) {
    EXPECT_TRUE(contains(r.output, "model.embed_tokens.weight is tied across pipeline ranks")) << r.output;
  }
  expect_run_matches(got, serial_[c.model], kRel, kAbs, "against the serial run");
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

// Layout-free checkpoints: 6 steps on dp 2 x tp 2, and the same run stopped at step 3 and resumed on
// pp 2 x tp 2 with ZB-H1 reach the same losses and final tensors (within the equivalence tolerance).
TEST(LlamaModel, ResumesOnAnotherLayout) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  auto run_of = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    auto ov = model_overrides("gqa");
    ov.insert(ov.end(), {"run.dir=\"" + dir.file(name) + "\"", "checkpoint.every=3"});
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.file(name);
  };
  const std::string a = run_of("a", 4, {"parallel.dp=2", "parallel.tp=2", "train.micro_batches=2"});
  const std::string b = run_of("b", 4, {"parallel.pp=2", "parallel.tp=2", "parallel.schedule=\"zb-h1\"",
                                        "train.micro_batches=4",
                                        "checkpoint.resume=\"" + a + "/checkpoints/step_00000003.h5\""});
  const auto la = read_losses(a), lb = read_losses(b);  // b's metrics hold steps 4-6
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(lb[i], la[i + 3], kAbs + kRel * std::abs(la[i + 3])) << "step " << i + 4;
  expect_tensors_within(read_checkpoint(b + "/checkpoints/step_00000006.h5"),
                        read_checkpoint(a + "/checkpoints/step_00000006.h5"), kRel, kAbs, "resumed on pp 2 x tp 2");
}

// bf16 (train.precision = "bf16": bf16 activations and working weights, grouped-query flash attention in
// bf16, f32 masters): tracks the fp32 run over 300 steps (the GPT criterion of test_bf16_mpi.cpp, mean
// relative loss difference over steps 251-300 below 1e-2), and dp 2 x tp 2 x pp 2 with ZeRO-1 and
// recomputation tracks the bf16 serial run within test_bf16_mpi.cpp's bf16 layout tolerance.
TEST(LlamaModel, Bf16TracksFp32AndLayoutsTrackBf16Serial) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 40001, 61, 32);
  std::map<std::string, std::vector<double>> losses;
  for (const char* prec : {"fp32", "bf16"}) {
    auto ov = model_overrides("gqa");
    ov.insert(ov.end(), {"run.dir=\"" + dir.file(prec) + "\"", std::string("train.precision=\"") + prec + "\"",
                         "train.steps=300", "optimizer.lr=1e-3", "lr_schedule.warmup_steps=10"});
    RunResult r = train(1, p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[prec] = read_losses(dir.file(prec));
  }
  const auto &a = losses["bf16"], &b = losses["fp32"];
  ASSERT_EQ(a.size(), 300u);
  const double mean = mean_relative_difference(a, b, 250, 300);
  EXPECT_LT(mean, 1e-2);
  EXPECT_LT(a.back(), 0.8 * a.front()) << "the bf16 run did not learn";
  std::printf("llama bf16 vs fp32 over steps 251-300: mean relative loss difference %.2e; loss %.4f -> %.4f\n", mean,
              a.front(), a.back());

  expect_bf16_layout_tracks_serial(p.config, model_overrides("gqa"), dir);
}

// relay plan's prediction equals the measured bytes per rank (memory.json), fp32 and bf16, with tp, pp
// and recomputation; GQA's key/value projections are n_kv_head / n_head of the query's.
TEST(LlamaModel, MemoryMatchesThePlan) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  for (const char* prec : {"fp32", "bf16"})
    for (bool rec : {false, true}) {
      const std::string run = dir.file(std::string(prec) + (rec ? "_rec" : ""));
      auto ov = model_overrides("gqa");
      ov.insert(ov.end(), {"run.dir=\"" + run + "\"", std::string("train.precision=\"") + prec + "\"",
                           "parallel.tp=2", "parallel.pp=2", "train.micro_batches=2", "train.steps=2",
                           std::string("train.recompute=\"") + (rec ? "blocks" : "none") + "\""});
      RunResult r = train(4, p.config, ov);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const auto ranks = nlohmann::json::parse(read_file(run + "/memory.json")).at("bytes_per_rank");
      ASSERT_EQ(ranks.size(), 4u);
      for (size_t w = 0; w < ranks.size(); ++w)
        for (const char* k : {"params", "grads", "optimizer", "activations"}) {
          const double got = ranks[w].at("measured").at(k), want = ranks[w].at("predicted").at(k);
          EXPECT_NEAR(got, want, 0.01 * want + 1024) << prec << (rec ? " recompute" : "") << " rank " << w << " " << k;
        }
    }
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
