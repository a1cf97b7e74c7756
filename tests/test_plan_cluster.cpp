// relay plan --cluster (src/plan/, src/cli/cmd_plan_cluster.cpp): cluster files with a missing key, a model no
// layout fits, a node count no layout can use (each one line naming the key or the reason, exit 1, through the real
// binary); and the recommendations: for GPT-3 175B on 1024 A100s and Llama 3 70B on 64 H100 nodes the top layout's
// predicted MFU is at least that of the layout published for that model (README "Planning a run").
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/config.hpp"
#include "core/error.hpp"
#include "model/family.hpp"
#include "plan/cluster.hpp"
#include "plan/search.hpp"
#include "plan/step_model.hpp"
#include "support/test_support.hpp"

namespace relay {
namespace {

using namespace relay::test;

std::string src(const std::string& p) { return std::string(RELAY_SOURCE_DIR) + "/" + p; }
std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
// The text without the line that starts with `key`.
std::string without(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind(key, 0) != 0) out += line + "\n";
  return out;
}
int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(PlanCluster, PresetsParse) {
  for (const char* name : {"a100-80gb-sxm-hdr", "h100-80gb-sxm-ndr", "h200-141gb-sxm-ndr"}) {
    const Cluster c = load_cluster(src(cat("configs/clusters/", name, ".toml")));
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.devices_per_node, 8);
    EXPECT_GT(c.device.peak_bf16, c.device.peak_tf32);
    EXPECT_GT(c.intra_node.busbw(), c.inter_node.busbw());
  }
}

TEST(PlanCluster, MissingKeyNamesTheKey) {
  const std::string text = read(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  for (const char* key : {"peak_bf16_flops", "memory_bytes", "devices", "bandwidth", "write_bandwidth"}) {
    try {
      parse_cluster_text(without(text, key), "x.toml");
      ADD_FAILURE() << "no error without " << key;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat(".", key, ": required key is missing")), std::string::npos) << e.what();
    }
  }
  // Through the binary: one line, exit 1.
  TempDir dir;
  std::ofstream(dir.file("c.toml")) << without(text, "latency");
  const RunResult r = run_command(relay_binary() + " plan --cluster " + dir.file("c.toml") + " --nodes 1 --config " +
                                  src("configs/models/llama3-8b.toml"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("intra_node.latency: required key is missing"), std::string::npos) << r.output;
}

TEST(PlanCluster, ModelFittingNoLayoutPrintsTheSmallestMemory) {
  // Llama 3 405B on one A100 node: 405B parameters x 6 bytes (fp32 masters, bf16 copies) alone exceed 8 x 80 GB.
  const RunResult r = run_command(relay_binary() + " plan --cluster " + src("configs/clusters/a100-80gb-sxm-hdr.toml") +
                                  " --nodes 1 --config " + src("configs/models/llama3-405b.toml") + " --global-batch 16");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("no layout fits"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the smallest needs"), std::string::npos) << r.output;
}

TEST(PlanCluster, NodesNoLayoutCanUse) {
  // 4 blocks (pp <= 4) and 1 head (tp 1) on 8 devices leave dp 2, 4 or 8, none of which divides a batch of 3.
  const RunResult r = run_command(relay_binary() + " plan --cluster " + src("configs/clusters/h100-80gb-sxm-ndr.toml") +
                                  " --nodes 1 --config " + src("configs/models/gpt3-175b.toml") +
                                  " --set model.n_layer=2 --set model.n_head=1 --set model.n_embd=64 --global-batch 3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("--nodes 1: no layout"), std::string::npos) << r.output;
}

TEST(PlanCluster, JsonFields) {
  const RunResult r = run_command(relay_binary() + " plan --cluster " + src("configs/clusters/h200-141gb-sxm-ndr.toml") +
                                  " --nodes 1 --config " + src("configs/models/llama3-8b.toml") + " --json --top 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines(r.output), 2) << r.output;
  for (const char* f : {"\"step_time_s\"", "\"tokens_per_s_per_device\"", "\"mfu\"", "\"hardware_flops_per_s_per_device\"",
                        "\"memory_bytes_per_device\"", "\"bubble_fraction\"", "\"exposed_comm_s\"", "\"layout\"",
                        "\"checkpoint_every\""})
    EXPECT_NE(r.output.find(f), std::string::npos) << f;
}

// Closing the loop on this machine: --calibrate writes a cluster file the planner reads; a run given it with
// --plan-cluster writes the prediction as metrics.jsonl's first record, step_time_s in every step record, and ends with
// the predicted-vs-measured table, its memory row exact (the memory plan).
TEST(PlanCluster, CalibrateThenTrainRecordsAndComparesThePlan) {
  TempDir dir;
  const Problem p = make_gpt_problem(dir.path());
  const std::string cal = dir.file("this-machine.toml");
  const RunResult plan = run_command(relay_binary() + " plan --config " + p.config + " --measure --calibrate " + cal);
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const Cluster c = load_cluster(cal);
  EXPECT_EQ(c.name, "this-machine");
  EXPECT_GT(c.device.peak_fp32, 0);
  const std::string run_dir = dir.file("run");
  const RunResult r = run_command("OMP_NUM_THREADS=1 " + relay_binary() + " train -c " + p.config + " --plan-cluster " +
                                  cal + " --set run.dir='\"" + run_dir + "\"' --set train.steps=3" +
                                  " --set lr_schedule.warmup_steps=0 --set train.log_every=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string metrics = read(run_dir + "/metrics.jsonl");
  EXPECT_EQ(metrics.rfind("{\"plan\": {", 0), 0u) << metrics.substr(0, 200);
  EXPECT_NE(metrics.find("\"calibration\":\"" + cal + "\""), std::string::npos);
  EXPECT_NE(metrics.find("{\"step\":3,"), std::string::npos);
  EXPECT_NE(metrics.find("\"step_time_s\":", metrics.find("{\"step\":1,")), std::string::npos);
  EXPECT_NE(r.output.find("relay: plan vs measured"), std::string::npos) << r.output;
  const size_t mem = r.output.find("  memory ");
  ASSERT_NE(mem, std::string::npos) << r.output;
  EXPECT_NE(r.output.substr(mem, r.output.find('\n', mem) - mem).find("+0.0%"), std::string::npos) << r.output;
}

// The top layout of the search against the published one, both predicted on the same preset.
void expect_recommendation_beats(const char* cluster, const char* model, int nodes, const std::vector<std::string>& published) {
  const Cluster cl = load_cluster(src(cat("configs/clusters/", cluster, ".toml")));
  const Config base = load_config(src(cat("configs/models/", model, ".toml")));
  const SearchResult s = search_layouts(cl, base, nodes, 1);
  ASSERT_FALSE(s.best.empty());
  const StepPrediction pub = predict_step(cl, load_config(src(cat("configs/models/", model, ".toml")), published));
  const StepPrediction& top = s.best.front().prediction;
  std::printf("%s on %d nodes of %s: top %s: MFU %.1f%%; published layout: MFU %.1f%%%s\n", model, nodes, cluster,
              describe_layout(s.best.front().cfg).c_str(), 100 * top.mfu, 100 * pub.mfu,
              pub.fits ? "" : " (does not fit Relay's memory)");
  EXPECT_GE(top.mfu, pub.mfu);
}

TEST(PlanCluster, Gpt3On1024A100sBeatsMegatronsLayout) {
  // Megatron-LM's GPT-3 175B recipe (examples/pretrain_gpt3_175B.sh, arXiv:2104.04473): tp 8, pp 16 (dp 8 on 128
  // nodes), 1536 sequences of 2048, micro-batch 1, activation recomputation.
  expect_recommendation_beats("a100-80gb-sxm-hdr", "gpt3-175b", 128,
                              {"parallel.tp=8", "parallel.pp=16", "parallel.dp=8", "train.micro_batches=192",
                               "train.recompute=\"blocks\""});
}

TEST(PlanCluster, Llama3_70BOn64H100NodesBeatsTorchtitansLayout) {
  // torchtitan's Llama 3.1 70B (benchmarks/llama3_h100_202412_torchtitan.md, Table 4): FSDP x TP 8, 16 sequences of
  // 8192 per FSDP rank in one micro-batch, full activation checkpointing; at 64 nodes dp 64, 1024 sequences.
  expect_recommendation_beats("h100-80gb-sxm-ndr", "llama3-70b", 64,
                              {"parallel.tp=8", "parallel.dp=64", "parallel.sequence_parallel=true", "optimizer.zero=3",
                               "train.micro_batches=1", "train.recompute=\"blocks\""});
}

}  // namespace
}  // namespace relay
