// What a block costs (model/block_cost.hpp): each block's GEMMs and attention add up to the forward FLOPs it states,
// and one FLOP count serves both MFUs: the training FLOPs per token a real run logs (metrics.jsonl's flops_per_s over
// tokens_per_s) equal those of `relay plan`'s prediction for the same config (its MFU x peak over tokens/s per device),
// for a GPT, a Llama and a Mixtral, whose count is its active experts' (below 6 x all its parameters).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/block_cost.hpp"
#include "model/family.hpp"
#include "plan/cluster.hpp"
#include "plan/step_model.hpp"
#include "support/test_support.hpp"
#include "train/model_layout.hpp"

namespace relay {
namespace {

using namespace relay::test;

std::string src(const std::string& p) { return source_dir() + "/" + p; }

// Every block with GEMMs: 2 M N K over its GEMMs on one rank of no parallelism, plus its attention, is the forward
// FLOPs it states per row (a MoE layer's router and k of its E experts: on one row the experts' rows are k / E each).
TEST(BlockCost, GemmsAndAttentionAreTheStatedForwardFlops) {
  for (const char* config : {"configs/gpt-small-bytes.toml", "configs/llama-small-bytes.toml",
                             "configs/mixtral-small-bytes.toml", "configs/qwen3-moe-small-bytes.toml",
                             "configs/demo.toml"}) {
    const ModelSpec m = make_model_spec(load_config(src(config)), 16);
    int checked = 0;
    for (const BlockSpec& b : m.blocks) {
      const BlockCost c = block_cost(b, {}, 1);
      if (c.gemms.empty()) continue;
      double flops = c.attention_flops_per_row;
      for (const Gemm& g : c.gemms) flops += 2 * g.M * g.N * g.K * g.count;
      EXPECT_DOUBLE_EQ(flops, c.forward_flops_per_row) << config << " block " << b.index << " ("
                                                       << block_kind_name(b.kind) << ")";
      ++checked;
    }
    EXPECT_GT(checked, 1) << config;
  }
}

// DeepSeek-V3's multi-token prediction block (model.num_mtp_layers = 2) costs its modules' parts: each decoder layer,
// shared head and embedding as its own block, plus eh_proj (n, C, 2C); its stated FLOPs are theirs plus 2 x C x 2C per
// module, and the plan's model FLOPs grow by exactly that.
TEST(BlockCost, MtpBlockIsItsModulesParts) {
  const std::string dir = ::testing::TempDir() + "block_cost_mtp";
  std::string text = read_file(src("configs/deepseek-v3-small-bytes.toml"));
  const size_t at = text.find("num_mtp_layers = 0");
  ASSERT_NE(at, std::string::npos);
  const ModelSpec plain = make_model_spec(load_config(src("configs/deepseek-v3-small-bytes.toml")), 16);
  text.replace(at, 18, "num_mtp_layers = 2");
  write_file(dir + ".toml", text);
  const ModelSpec m = make_model_spec(load_config(dir + ".toml"), 16);
  ASSERT_EQ(m.blocks.size(), plain.blocks.size() + 1);
  const BlockSpec& b = m.blocks[m.blocks.size() - 2];
  ASSERT_EQ(b.kind, BlockKind::mtp);
  ASSERT_EQ(b.inner.size(), 6u);
  EXPECT_FALSE(m.blocks.back().starts_unit);  // the head stays on the MTP modules' stage
  const double n = 32, C = double(b.in);
  const BlockCost c = block_cost(b, {}, n);
  size_t gemms = 0;
  double flops = 0;
  for (const BlockSpec& in : b.inner) {
    gemms += block_cost(in, {}, n).gemms.size();
    flops += in.flops;
  }
  EXPECT_EQ(c.gemms.size(), gemms + 2);  // + eh_proj per module
  EXPECT_DOUBLE_EQ(c.gemms.back().N, C);
  EXPECT_DOUBLE_EQ(c.gemms.back().K, 2 * C);
  const double embeddings = 2 * C;  // the inner lm_embeddings' stated C each, counted by their parts
  EXPECT_DOUBLE_EQ(b.flops + embeddings, flops + 2 * 4 * C * C);
  EXPECT_DOUBLE_EQ(model_flops_per_row(m) - model_flops_per_row(plain), 3 * b.flops);
  // Its active parameters: its routed experts k of E, like a main MoE layer's.
  double added = 0;
  for (size_t j = 2; j < b.params.size(); ++j) added += double(shape_numel(b.params[j].shape));
  EXPECT_GT(active_parameters(m) - active_parameters(plain), 0.0);
  EXPECT_LT(active_parameters(m) - active_parameters(plain), added);
  // The official checkpoints' names for module 1 (model.layers.{n_layer}.*).
  std::set<std::string> names;
  for (const ParamSpec& p : b.params) names.insert(p.name);
  for (const char* want : {"model.embed_tokens.weight", "lm_head.weight", "model.layers.2.enorm.weight",
                           "model.layers.2.hnorm.weight", "model.layers.2.eh_proj.weight",
                           "model.layers.2.shared_head.norm.weight", "model.layers.3.mlp.gate.weight"})
    EXPECT_TRUE(names.count(want)) << want;
}

// Rank 0's metrics.jsonl records: flops_per_s / tokens_per_s of each.
std::vector<double> logged_flops_per_token(const std::string& run_dir) {
  std::vector<double> out;
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("flops_per_s") && j.contains("tokens_per_s"))
      out.push_back(j["flops_per_s"].get<double>() / j["tokens_per_s"].get<double>());
  }
  return out;
}

TEST(BlockCost, RunLogsTheModelFlopsThePlannerCounts) {
  TempDir dir;
  const Problem data = make_gpt_problem(dir.file("data"), 4097, 256, 64);
  const Cluster cluster = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  for (const char* name : {"gpt-small-bytes", "llama-small-bytes", "mixtral-small-bytes"}) {
    SCOPED_TRACE(name);
    const std::string config = src(cat("configs/", name, ".toml")), run_dir = dir.file(name);
    const std::vector<std::string> sets = {cat("data.train=\"", data.data, "\""), cat("data.eval=\"", data.eval, "\""),
                                           cat("run.dir=\"", run_dir, "\""), "train.steps=2", "train.log_every=1",
                                           "lr_schedule.warmup_steps=0"};
    const RunResult r = train(1, config, sets);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> logged = logged_flops_per_token(run_dir);
    ASSERT_EQ(logged.size(), 2u) << read_file(run_dir + "/metrics.jsonl");

    // The planner's MFU for the same config is model FLOPs x tokens / step / devices / peak.
    const Config cfg = load_config(config, sets);
    const StepPrediction p = predict_step(cluster, cfg);
    const double planned = p.mfu * cluster.device.peak(cfg.train.precision) / p.tokens_per_s_per_device;
    for (const double f : logged) EXPECT_NEAR(f, planned, 1e-12 * planned);

    const ModelLayout layout = make_layout(cfg, 0);
    const double params = double(layout.param_count());
    std::printf("%s: %.0f training FLOPs per token logged, %.0f planned; 6 x parameters %.0f\n", name, logged[0],
                planned, 6 * params);
    const bool moe = std::string(name) == "mixtral-small-bytes";
    ASSERT_EQ(layout.model.blocks[1].moe.on(), moe);
    if (moe) {
      // The bug this count fixed: 6 x every parameter counts all E experts where a token runs k of them.
      EXPECT_LT(logged[0], 6 * params);
      EXPECT_LT(active_parameters(layout.model), 0.5 * params);
    }
  }
}

}  // namespace
}  // namespace relay
