// DeepSeek-V3 models (dense layers, multi-head latent attention: model/mla_blocks.cpp) keep Relay's guarantee: every
// layout gives the serial run's result up to floating-point reordering, and a layout run twice gives the same bits.
// The real binary trains a 4-layer DeepSeek-V3 (4 heads of 8 + 4 query/key columns and 6 value columns, q_lora_rank
// 24, kv_lora_rank 16; tp 2 holds 2 heads a rank, the a-projections and norms replicated) on the GPT equivalence
// test's token file for 6 steps under mpirun: dp, tp, pipeline schedules, ZeRO-1, recomputation, context
// parallelism (cp 2 and tp 2 x cp 2, with and without data.document_mask on a file of documents ending at token 0) and
// sequence parallelism (tp 2: MLA's input norm gathered before the a-projections, its outputs reduce-scattered).
// Every step's loss and every final tensor (parameters and AdamW state) is compared with the serial run of the same
// model and data. Multi-token prediction (model.num_mtp_layers = 2, model/mtp_block.cpp) with documents on cp 2 against
// the serial MTP run with documents: the main loss, every step's mtp_loss and every tensor (the modules' included),
// and the same bits when run twice.
// With routed-expert layers (layers 1-3 of 4: 8 experts in 4 groups, the best 2 groups kept, top 2, one
// shared expert, routed_scaling_factor 2.5, the per-sequence aux loss and moe.expert_bias updated every step): ep 2,
// dp 2 x ep 2 x pp 2 with ZeRO-1 and recomputation, tp 2 x dp 2 x ep 2 (also with sequence parallelism: the experts'
// and shared experts' output reduce-scattered) and cp 2 against the serial run, the bias
// (router/expert_bias) included.
//
// Tolerance: |a - b| <= 1e-6 + 1e-5 |b|, as for Llama.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <cstdio>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case {
  int dp = 1, tp = 1, pp = 1;
  std::string schedule = "1f1b";
  int m = 1;
  bool zero = false, recompute = false;
  int cp = 1;
  bool docs = false;  // data.document_mask
  bool sp = false;    // parallel.sequence_parallel
  int mtp = 0;        // model.num_mtp_layers (against the serial run with as many)
  int ranks() const { return dp * tp * pp * cp; }
  std::string name() const {
    std::string s = "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_" +
                    schedule + "_m" + std::to_string(m) + (zero ? "_zero" : "") + (recompute ? "_recompute" : "") +
                    (cp > 1 ? "_cp" + std::to_string(cp) : "") + (docs ? "_docs" : "") + (sp ? "_sp" : "") +
                    (mtp > 0 ? "_mtp" + std::to_string(mtp) : "");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// The GPT problem's config made a DeepSeek-V3 with every layer dense (the MoE keys read, none routing).
std::vector<std::string> model_overrides() {
  return {"model.type=\"deepseek_v3\"", "model.n_embd=32", "model.n_head=4", "model.ffn_hidden=48",
          "model.q_lora_rank=24", "model.kv_lora_rank=16", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
          "model.v_head_dim=6", "model.rope_theta=500.0", "model.norm_eps=1e-6", "model.n_routed_experts=4",
          "model.num_experts_per_tok=2", "model.n_group=2", "model.topk_group=1", "model.first_k_dense_replace=4"};
}

std::vector<std::string> layout_overrides(const Case& c) {
  return {"parallel.dp=" + std::to_string(c.dp), "parallel.tp=" + std::to_string(c.tp),
          "parallel.cp=" + std::to_string(c.cp),
          "parallel.pp=" + std::to_string(c.pp), "parallel.schedule=\"" + c.schedule + "\"",
          "train.micro_batches=" + std::to_string(c.m),
          "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1),
          std::string("optimizer.zero=") + (c.zero ? "true" : "false"),
          std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\""),
          std::string("parallel.sequence_parallel=") + (c.sp ? "true" : "false")};
}

// The MoE layers' keys (model/moe.hpp's DeepSeek-V3 routing) and its training terms.
std::vector<std::string> moe_overrides() {
  return {"model.first_k_dense_replace=1", "model.n_routed_experts=8", "model.num_experts_per_tok=2",
          "model.n_group=4", "model.topk_group=2", "model.moe_intermediate_size=16", "model.n_shared_experts=1",
          "model.routed_scaling_factor=2.5", "model.router_aux_loss_coef=0.01", "moe.expert_bias=true",
          "moe.bias_update_rate=0.001"};
}

const Case kCases[] = {
    {2, 1, 1, "1f1b", 2},
    {1, 2, 1, "1f1b", 1},
    {1, 1, 2, "zb-h1", 4},
    {2, 2, 1, "1f1b", 2, /*zero=*/true},
    {1, 2, 2, "interleaved", 4, false, /*recompute=*/true},
    {1, 1, 1, "1f1b", 2, false, false, /*cp=*/2},
    {1, 2, 1, "1f1b", 1, false, /*recompute=*/true, /*cp=*/2, /*docs=*/true},
    {1, 2, 1, "1f1b", 2, false, false, 1, false, /*sp=*/true},
    // cp 2 with documents, with multi-token prediction (D = 2) on top: the main layers' cp 2 x documents row and the
    // MTP modules' (their shift on whole sequences, their attention through cp), against the serial MTP run.
    {1, 1, 1, "1f1b", 2, false, false, /*cp=*/2, /*docs=*/true, false, /*mtp=*/2},
};

// Every step's mtp_loss (the MTP modules' mean CE_k) from <run_dir>/metrics.jsonl.
std::vector<double> read_mtp_losses(const std::string& run_dir) {
  std::vector<double> out;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("mtp_loss")) out.push_back(j.at("mtp_loss").get<double>());
  }
  return out;
}

// The serial run's directory name for data.document_mask and model.num_mtp_layers.
std::string serial_name(bool docs, int mtp) {
  return std::string("serial") + (docs ? "_docs" : "") + (mtp > 0 ? "_mtp" + std::to_string(mtp) : "");
}

// The document file (data.document_mask) instead of the GPT problem's tokens.
std::vector<std::string> data_overrides(bool docs, const std::string& dir) {
  if (!docs) return {};
  return {"data.train=\"" + dir + "/docs.h5\"", "data.eval=\"" + dir + "/docs_eval.h5\"", "data.document_mask=true"};
}

class DeepseekV3Equivalence : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    write_documents(dir_->file("docs.h5"));
    write_documents(dir_->file("docs_eval.h5"), 8, 1025);
    for (const Case& c : kCases) {  // one serial run per (documents, MTP depth) of the table
      const std::pair<bool, int> key{c.docs, c.mtp};
      if (serial_.count(key)) continue;
      serial_[key] = train_and_record(1, problem_.config, overrides(c.docs, mtp_overrides(c.mtp)),
                                      dir_->file(serial_name(c.docs, c.mtp)));
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::pair<bool, int>, RunRecord> serial_;  // by (data.document_mask, model.num_mtp_layers)
  static std::vector<std::string> mtp_overrides(int mtp) {
    if (mtp == 0) return {};
    return {"model.num_mtp_layers=" + std::to_string(mtp), "model.mtp_loss_weight=0.3"};
  }
  // The model's, the data's (with or without documents) and `extra` overrides.
  static std::vector<std::string> overrides(bool docs, const std::vector<std::string>& extra) {
    auto ov = model_overrides();
    for (const std::string& s : data_overrides(docs, dir_->path())) ov.push_back(s);
    ov.insert(ov.end(), extra.begin(), extra.end());
    return ov;
  }
};
std::unique_ptr<TempDir> DeepseekV3Equivalence::dir_;
Problem DeepseekV3Equivalence::problem_;
std::map<std::pair<bool, int>, RunRecord> DeepseekV3Equivalence::serial_;

TEST_P(DeepseekV3Equivalence, MatchesSerialRun) {
  const Case& c = GetParam();
  const RunRecord& serial = serial_[{c.docs, c.mtp}];
  ASSERT_EQ(serial.losses.size(), 6u);
  auto extra = layout_overrides(c);
  for (const std::string& s : mtp_overrides(c.mtp)) extra.push_back(s);
  const auto ov = overrides(c.docs, extra);
  const RunRecord got = train_and_record(c.ranks(), problem_.config, ov, dir_->file(c.name()));
  expect_run_matches(got, serial, kRel, kAbs, "against the serial run");
  if (c.mtp > 0) {  // the loss run_matches compares is the main model's: the modules' mean CE_k too, every step
    const auto want = read_mtp_losses(dir_->file(serial_name(c.docs, c.mtp)));
    const auto have = read_mtp_losses(dir_->file(c.name()));
    ASSERT_EQ(have.size(), 6u);
    ASSERT_EQ(want.size(), 6u);
    for (size_t i = 0; i < have.size(); ++i)
      EXPECT_NEAR(have[i], want[i], kAbs + kRel * std::abs(want[i])) << "mtp_loss at step " << i + 1;
  }
  if ((c.tp > 1 && c.pp == 1 && !c.zero && c.cp == 1) || c.mtp > 0) {  // the same layout again: the same bits
    const RunRecord again = train_and_record(c.ranks(), problem_.config, ov, dir_->file(c.name() + "_again"));
    EXPECT_EQ(again.losses, got.losses);
    for (const auto& [name, v] : got.tensors)
      EXPECT_EQ(again.tensors.at(name), v) << name << " differs between two runs";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeepseekV3Equivalence, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name(); });

// The MoE model on expert-parallel layouts equals its serial run within 1e-5 (losses, parameters, AdamW state and
// the expert bias the bias update moved).
TEST(DeepseekV3Moe, ExpertParallelLayoutsMatchSerialRun) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  auto run = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    auto ov = model_overrides();
    for (const std::string& s : moe_overrides()) ov.push_back(s);
    ov.push_back("run.dir=\"" + dir.file(name) + "\"");
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.file(name);
  };
  const std::string serial = run("serial", 1, {"train.micro_batches=2"});
  const auto serial_losses = read_losses(serial);
  const auto serial_tensors = read_checkpoint(serial + "/checkpoints/step_00000006.h5");
  ASSERT_EQ(serial_losses.size(), 6u);
  ASSERT_TRUE(serial_tensors.count("router/expert_bias")) << "the checkpoint holds no expert bias";
  bool moved = false;
  for (float b : serial_tensors.at("router/expert_bias")) moved = moved || b != 0.f;
  EXPECT_TRUE(moved) << "bias_update_rate left every expert bias at 0";
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"dp2_ep2", {"parallel.dp=2", "parallel.ep=2", "train.micro_batches=2"}},
      {"dp2_ep2_pp2_zero_recompute", {"parallel.dp=2", "parallel.ep=2", "parallel.pp=2", "train.micro_batches=2",
                                      "optimizer.zero=true", "train.recompute=\"blocks\""}},
      {"tp2_dp2_ep2", {"parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "train.micro_batches=2"}},
      {"tp2_dp2_ep2_sp", {"parallel.tp=2", "parallel.dp=2", "parallel.ep=2", "train.micro_batches=2",
                          "parallel.sequence_parallel=true"}},
      {"cp2", {"parallel.cp=2", "train.micro_batches=2"}}};
  for (const auto& [name, extra] : layouts) {
    const int ranks = name == "dp2_ep2" || name == "cp2" ? 2 : 4;
    const std::string d = run(name, ranks, extra);
    const auto losses = read_losses(d);
    ASSERT_EQ(losses.size(), serial_losses.size()) << name;
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], serial_losses[i], kAbs + kRel * std::abs(serial_losses[i])) << name << " step " << i + 1;
    expect_tensors_within(read_checkpoint(d + "/checkpoints/step_00000006.h5"), serial_tensors, kRel, kAbs,
                          name + " against the serial run");
  }
}

// A checkpoint of the MoE model written on dp 4 x ep 4 (two experts a rank) resumes serially and on tp 2 x pp 2: steps
// 4-6 and the final tensors (the expert bias included) equal the run that never stopped, within 1e-5.
TEST(DeepseekV3Moe, ResumesFromEp4OnAnotherLayout) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  auto run = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    auto ov = model_overrides();
    for (const std::string& s : moe_overrides()) ov.push_back(s);
    ov.insert(ov.end(), {"run.dir=\"" + dir.file(name) + "\"", "checkpoint.every=3"});
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.file(name);
  };
  const std::string a = run("ep4", 4, {"parallel.dp=4", "parallel.ep=4"});
  const std::string at3 = "checkpoint.resume=\"" + a + "/checkpoints/step_00000003.h5\"";
  const std::string serial = run("serial", 1, {at3});
  const std::string tp_pp = run("tp2_pp2", 4, {at3, "parallel.tp=2", "parallel.pp=2", "train.micro_batches=2"});
  const auto la = read_losses(a);
  ASSERT_EQ(la.size(), 6u);
  for (const std::string& resumed : {serial, tp_pp}) {
    const auto lb = read_losses(resumed);  // steps 4-6
    ASSERT_EQ(lb.size(), 3u) << resumed;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(lb[i], la[i + 3], kAbs + kRel * std::abs(la[i + 3])) << resumed << ": step " << i + 4;
    expect_tensors_within(read_checkpoint(resumed + "/checkpoints/step_00000006.h5"),
                          read_checkpoint(a + "/checkpoints/step_00000006.h5"), kRel, kAbs, "resumed from ep 4");
  }
}

// train.precision = "bf16" (bf16 activations, working weights and gradients, f32 masters): the serial run tracks the
// fp32 one over 60 steps (mean relative loss difference over steps 41-60 below 1e-2, the criterion of
// test_bf16_mpi.cpp over fewer steps), and dp 2 x tp 2 x pp 2 with ZeRO-1 and recomputation tracks the bf16 serial run
// within the bf16 layout tolerance of test_llama_equivalence_mpi.cpp (its layout).
TEST(DeepseekV3Model, Bf16TracksFp32AndLayoutsTrackBf16Serial) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  std::map<std::string, std::vector<double>> losses;
  for (const char* prec : {"fp32", "bf16"}) {
    auto ov = model_overrides();
    ov.insert(ov.end(), {"run.dir=\"" + dir.file(prec) + "\"", std::string("train.precision=\"") + prec + "\"",
                         "train.steps=60", "optimizer.lr=1e-3"});
    RunResult r = train(1, p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    losses[prec] = read_losses(dir.file(prec));
  }
  const auto &a = losses["bf16"], &b = losses["fp32"];
  ASSERT_EQ(a.size(), 60u);
  const double mean = mean_relative_difference(a, b, 40, 60);
  EXPECT_LT(mean, 1e-2);
  EXPECT_LT(a.back(), 0.9 * a.front()) << "the bf16 run did not learn";
  std::printf("deepseek_v3 bf16 vs fp32 over steps 41-60: mean relative loss difference %.2e; loss %.4f -> %.4f\n",
              mean, a.front(), a.back());
  expect_bf16_layout_tracks_serial(p.config, model_overrides(), dir);
}

// relay plan's prediction (the MLA block's saved buffers, model/block_cost.cpp) equals the measured bytes per rank
// (memory.json) on tp 2 x pp 2, fp32 and bf16, and for the MoE model (the experts' buffers) on dp 2 x ep 2 x pp 2.
TEST(DeepseekV3Model, MemoryMatchesThePlan) {
  RELAY_SKIP_WITHOUT_CPU_BF16();
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  for (const char* prec : {"fp32", "bf16", "moe"}) {
    const std::string run = dir.file(prec);
    const bool moe = std::string(prec) == "moe";
    auto ov = model_overrides();
    if (moe)
      for (const std::string& s : moe_overrides()) ov.push_back(s);
    ov.insert(ov.end(), {"run.dir=\"" + run + "\"", std::string("train.precision=\"") + (moe ? "fp32" : prec) + "\"",
                         "parallel.pp=2", "train.micro_batches=2", "train.steps=2"});
    if (moe) ov.insert(ov.end(), {"parallel.dp=2", "parallel.ep=2"});
    else ov.push_back("parallel.tp=2");
    RunResult r = train(4, p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto ranks = nlohmann::json::parse(read_file(run + "/memory.json")).at("bytes_per_rank");
    ASSERT_EQ(ranks.size(), 4u);
    for (size_t w = 0; w < ranks.size(); ++w)
      for (const char* k : {"params", "grads", "optimizer", "activations"}) {
        const double got = ranks[w].at("measured").at(k), want = ranks[w].at("predicted").at(k);
        EXPECT_NEAR(got, want, 0.01 * want + 1024) << prec << " rank " << w << " " << k;
      }
  }
}

}  // namespace
