// relay plan --cluster (src/plan/, src/cli/cmd_plan_cluster.cpp): cluster files with a missing key, a model no
// layout fits, a node count no layout can use (each one line naming the key or the reason, exit 1, through the real
// binary); and the recommendations: for GPT-3 175B on 1024 A100s and Llama 3 70B on 64 H100 nodes the top layout's
// predicted MFU is at least that of the layout published for that model (docs/planning.md "Recommendations"); and
// expert parallelism: the search over ep for Mixtral 8x7B, ep 8 against ep 1 under --layout, and the planned memory
// of a dp 2 x ep 2 Mixtral and DeepSeek-V3 against what their runs measure. DeepSeek-V3 671B
// (configs/models/deepseek-v3.toml): its parameters and active parameters, and an MLA layer's FLOPs against a hand
// count. The search's per-shape cache (plan/layout_cache.hpp) predicts every figure as a fresh prediction does.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "core/config.hpp"
#include "core/error.hpp"
#include "model/block_cost.hpp"
#include "model/family.hpp"
#include "model/model_spec.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/partition.hpp"
#include "plan/cluster.hpp"
#include "plan/layout_cache.hpp"
#include "plan/collectives.hpp"
#include "plan/cost_model.hpp"
#include "plan/link_calibration.hpp"
#include "plan/search.hpp"
#include "plan/step_model.hpp"
#include "support/test_support.hpp"
#include "train/memory_plan.hpp"
#include "train/model_layout.hpp"

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

// [device] backend: optional ("cuda" unless said), "cpu" or "cuda"; anything else names the key and the value.
TEST(PlanCluster, DeviceBackendIsCpuOrCuda) {
  const std::string text = read(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  EXPECT_EQ(parse_cluster_text(text, "x.toml").device.backend, Device::cuda);
  auto with_backend = [&](const std::string& value) {
    std::string t = text;
    const size_t at = t.find("[device]\n") + std::string("[device]\n").size();
    return t.insert(at, "backend = \"" + value + "\"\n");
  };
  EXPECT_EQ(parse_cluster_text(with_backend("cpu"), "x.toml").device.backend, Device::cpu);
  EXPECT_EQ(parse_cluster_text(with_backend("cuda"), "x.toml").device.backend, Device::cuda);
  try {
    parse_cluster_text(with_backend("tpu"), "x.toml");
    ADD_FAILURE() << "no error for backend = tpu";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.toml: device.backend = \"tpu\": must be \"cpu\" or \"cuda\""),
              std::string::npos) << e.what();
  }
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

// The link fit recovers the alpha, busbw and reduce_bw that made the times (nccl-tests' bus bytes, ring steps, a
// reduction's (n-1)/n of the buffer summed), and the planner's reducing collectives pay for the sums.
TEST(PlanCluster, LinkFitRecoversTheLinkAndReductionsPayForTheSums) {
  const double alpha = 5e-6, busbw = 4e9, reduce_bw = 1e9;
  std::vector<CollectiveSample> samples;
  for (const int n : {2, 4})
    for (double bytes = 4096; bytes <= 64 << 20; bytes *= 4)
      for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
        CollectiveSample s{op, n, bytes, 0};
        s.seconds = s.steps() * alpha + s.bytes * s.bus_factor() / busbw + s.reduced_bytes() / reduce_bw;
        samples.push_back(s);
      }
  const LinkFit f = fit_link(samples);
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.busbw, busbw, 1e-6 * busbw);
  EXPECT_NEAR(f.latency, alpha, 1e-9 * alpha + 1e-15);
  EXPECT_NEAR(f.reduce_bw, reduce_bw, 1e-6 * reduce_bw);
  EXPECT_LT(f.rms_error, 1e-9);
  EXPECT_NE(samples_table(samples, f).find("#   reduce_scatter      4"), std::string::npos);

  Cluster c = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  const GroupPath plain = group_path(c, 4, 1);
  c.intra_node.reduce_bandwidth = reduce_bw;
  const GroupPath summing = group_path(c, 4, 1);
  const double bytes = 64 << 20;
  EXPECT_DOUBLE_EQ(reduce_scatter_s(summing, bytes) - reduce_scatter_s(plain, bytes), 0.75 * bytes / reduce_bw);
  EXPECT_DOUBLE_EQ(all_gather_s(summing, bytes), all_gather_s(plain, bytes));
  EXPECT_GE(all_reduce_s(summing, bytes) - all_reduce_s(plain, bytes), 0.75 * bytes / reduce_bw);
}

// Closing the loop on this machine: --calibrate under mpirun writes a cluster file the planner reads, its links
// measured through the communicator (a table per collective and size, the fitted latency and bandwidth); a run given it with --plan-cluster writes the prediction as metrics.jsonl's first record,
// step_time_s in every step record, and ends with the predicted-vs-measured table, its memory row exact (the memory
// plan).
TEST(PlanCluster, CalibrateThenTrainRecordsAndComparesThePlan) {
  TempDir dir;
  const Problem p = make_gpt_problem(dir.path());
  const std::string cal = dir.file("this-machine.toml");
  const RunResult plan = run_command(mpirun_relay(2) + " plan --config " + p.config + " --measure --calibrate " + cal);
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_EQ(plan.output.find("plan for"), plan.output.rfind("plan for")) << "only rank 0 prints the plan";
  const Cluster c = load_cluster(cal);
  EXPECT_EQ(c.name, "this-machine");
  EXPECT_GT(c.device.peak_fp32, 0);
  const std::string text = read(cal);
  EXPECT_NE(text.find("# Measured through the communicator: 2 ranks on one host (mpi"), std::string::npos) << text;
  for (const char* row : {"#   all_reduce          2   16777216", "#   all_to_all          2       4096"})
    EXPECT_NE(text.find(row), std::string::npos) << row << "\n" << text;
  EXPECT_GT(c.intra_node.bandwidth, 1e8);  // shared memory moves more than 100 MB/s
  EXPECT_EQ(c.intra_node.efficiency, 1.0);
  EXPECT_EQ(c.inter_node.bandwidth, c.intra_node.bandwidth) << "no second host: as within the node";
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

// Mixtral 8x7B on 8 H100 nodes: the search tries ep over the divisors of dp that divide the 8 experts (and tp over
// each expert's units), and some of its 40 best layouts split the experts (the expert state, 45 of the 46.7B
// parameters, is what fills memory). Below ZeRO-3 ep holds 1 / ep of the expert state but waits for all-to-alls and
// keeps receive buffers sized for the worst routing (ep x the routed rows), so it need not win: wherever the same
// layout at ep 1 fits and runs faster, the search ranks that one above it. ZeRO-3 shards the experts' state over
// every dp rank at any ep (1 / dp of it either way): there ep trades smaller gathers for its all-to-alls.
TEST(PlanCluster, MixtralSearchSplitsExperts) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  const Config base = load_config(src("configs/models/mixtral-8x7b.toml"));
  const SearchResult s = search_layouts(cl, base, 8, 40);
  ASSERT_FALSE(s.best.empty());
  EXPECT_TRUE(s.best.front().prediction.fits);
  int with_ep = 0, below_zero3 = 0;
  for (const PlannedLayout& l : s.best) {
    std::printf("%s: %.0f tok/s/dev, %.1f GiB, ep all-to-alls %.3f s of %.3f s\n   why: %s\n",
                describe_layout(l.cfg).c_str(), l.prediction.tokens_per_s_per_device,
                l.prediction.memory_bytes_per_device / double(1 << 30), l.prediction.ep_comm_s,
                l.prediction.step_time_s, l.why.c_str());
    EXPECT_TRUE(l.prediction.fits);
    EXPECT_EQ(14336 % l.cfg.parallel.tp, 0);  // each expert's SwiGLU units split over tp
    if (l.cfg.parallel.ep == 1) continue;
    ++with_ep;
    EXPECT_EQ(l.cfg.parallel.dp % l.cfg.parallel.ep, 0);
    EXPECT_GT(l.prediction.ep_comm_s, 0);
    EXPECT_NE(l.why.find(cat("ep ", l.cfg.parallel.ep, ": ")), std::string::npos) << l.why;
    if (l.cfg.optimizer.zero >= 3) continue;
    ++below_zero3;
    Config dense = l.cfg;
    dense.parallel.ep = 1;
    const StepPrediction one = predict_step(cl, dense);
    if (!one.fits || one.tokens_per_s_per_device <= l.prediction.tokens_per_s_per_device) continue;
    bool ranked_above = false;
    for (const PlannedLayout& o : s.best) {
      if (&o == &l) break;
      ranked_above = ranked_above || describe_layout(o.cfg) == describe_layout(dense);
    }
    EXPECT_TRUE(ranked_above) << describe_layout(l.cfg) << ": its ep 1 twin fits and runs faster, yet is not listed above";
  }
  EXPECT_GT(with_ep, 0) << "no layout among the best splits the experts";
  EXPECT_GT(below_zero3, 0) << "no layout among the best splits the experts below ZeRO-3";
}

// --layout with parallel.ep = 8 against ep = 1, the rest of the layout the same (dp 16 x pp 4 on 8 nodes, micro-batches
// of one sequence, recomputation): each rank holds an eighth of the experts' state (less memory: the worst-case
// receive buffers, 4x the routed rows at ep 8, are small beside it here) and waits for the four all-to-alls of every
// MoE layer (more exposed communication); the JSON layout names ep.
TEST(PlanCluster, LayoutWithExpertParallelism) {
  auto plan = [](int ep) {
    const RunResult r =
        run_command(relay_binary() + " plan --cluster " + src("configs/clusters/h100-80gb-sxm-ndr.toml") +
                    " --nodes 8 --config " + src("configs/models/mixtral-8x7b.toml") +
                    " --layout --json --set parallel.dp=16 --set parallel.pp=4 --set train.micro_batches=64"
                    " --set optimizer.zero=1 --set train.recompute='\"blocks\"' --set parallel.ep=" +
                    std::to_string(ep));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  };
  const nlohmann::json one = plan(1), eight = plan(8);
  EXPECT_EQ(one["layout"]["ep"], 1);
  EXPECT_EQ(eight["layout"]["ep"], 8);
  std::printf("ep 1: %.1f GiB, exposed comm %.3f s, step %.3f s; ep 8: %.1f GiB, exposed comm %.3f s, step %.3f s\n",
              one["memory_bytes_per_device"].get<double>() / double(1 << 30), one["exposed_comm_s"].get<double>(),
              one["step_time_s"].get<double>(), eight["memory_bytes_per_device"].get<double>() / double(1 << 30),
              eight["exposed_comm_s"].get<double>(), eight["step_time_s"].get<double>());
  EXPECT_LT(eight["memory_bytes_per_device"].get<double>(), one["memory_bytes_per_device"].get<double>());
  EXPECT_GT(eight["exposed_comm_s"].get<double>(), one["exposed_comm_s"].get<double>());
  EXPECT_NE(eight["why"].get<std::string>().find("config's layout"), std::string::npos);
}

// The planner's memory for a Mixtral on dp 2 x ep 2 is the memory plan's (train/memory_plan.hpp) at ep 2, which a
// training run measures: the largest rank's measured bytes (memory.json) equal relay plan --cluster --layout's. The
// same for a DeepSeek-V3 (MLA's queries, keys and narrower values, both latents; a dense layer 0, then group-routed
// experts with a shared one).
TEST(PlanCluster, ExpertParallelMemoryEqualsTheRunsMeasurement) {
  const std::vector<std::string> mixtral = {"model.type=\"mixtral\"", "model.n_embd=32", "model.n_head=4",
                                            "model.n_kv_head=2", "model.n_experts=8", "model.experts_per_token=2",
                                            "model.moe_ffn_hidden=24"};
  const std::vector<std::string> deepseek = {
      "model.type=\"deepseek_v3\"", "model.n_embd=32", "model.n_head=4", "model.ffn_hidden=48",
      "model.q_lora_rank=24", "model.kv_lora_rank=16", "model.qk_nope_head_dim=8", "model.qk_rope_head_dim=4",
      "model.v_head_dim=6", "model.n_routed_experts=8", "model.num_experts_per_tok=2",
      "model.moe_intermediate_size=16", "model.n_group=2", "model.topk_group=1", "model.first_k_dense_replace=1"};
  for (const auto* model : {&mixtral, &deepseek}) {
    TempDir dir;
    const Problem p = make_gpt_problem(dir.path());
    std::vector<std::string> moe = *model;
    moe.insert(moe.end(), {"parallel.dp=2", "train.micro_batches=2", "optimizer.zero=true"});
    auto sets = [&](int ep) {
      std::string s;
      for (const std::string& o : moe) s += " --set '" + o + "'";
      return s + " --set parallel.ep=" + std::to_string(ep);
    };
    auto planned = [&](int ep) {
      const RunResult r = run_command(relay_binary() + " plan --cluster " +
                                      src("configs/clusters/h100-80gb-sxm-ndr.toml") + " --config " + p.config +
                                      " --layout --json" + sets(ep));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return nlohmann::json::parse(r.output)["memory_bytes_per_device"].get<double>();
    };
    std::vector<std::string> ov = moe;
    ov.insert(ov.end(), {"parallel.ep=2", "run.dir=\"" + dir.file("run") + "\"", "train.steps=1",
                         "lr_schedule.warmup_steps=0"});
    const RunResult r = train(2, p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto mem = nlohmann::json::parse(read(dir.file("run") + "/memory.json"));
    ASSERT_EQ(mem["bytes_per_rank"].size(), 2u);
    double measured = 0;
    for (const auto& rank : mem["bytes_per_rank"]) {
      double total = 0;
      for (const char* kind : {"params", "grads", "optimizer", "activations"})
        total += rank["measured"][kind].get<double>();
      measured = std::max(measured, total);
    }
    const double at_ep2 = planned(2), at_ep1 = planned(1);
    std::printf("%s dp 2 x ep 2: measured %.0f bytes, planned %.0f (ep 1: %.0f)\n", moe[0].c_str(), measured, at_ep2,
                at_ep1);
    EXPECT_EQ(at_ep2, measured) << moe[0];
    EXPECT_NE(at_ep1, at_ep2) << moe[0];  // the planner reads parallel.ep
  }
}

// Issue 40's configuration: a 32B GPT on 48 H100 nodes at tp 8 (sp) x dp 48, ZeRO-1, 4 micro-batches of one sequence.
// With parallel.overlap the gradient reduce-scatters start block after block inside the last micro-batch's backward
// and the parameter all-gather hides behind the next forward: less exposed communication and a shorter step than
// overlap = false (which is what the planner printed before: 1.60 s, 0.93 s exposed), and never more than the sum.
// ZeRO-2/3's per-block moves on one stage, timed as Relay issues them (plan/step_model.hpp zero_block_waits), by hand:
// three blocks of forward 1 s and backward 2 s. A gather of 0.5 s: the forward waits for the first block's only (the
// next one's travels behind the block before); the backward for its first block's gather, and then (once a step) for
// the last reduce-scatter, launched as the backward ends. A gather of 1.5 s, longer than a forward block: each one waits behind the last on
// the link, and the forward ends when the link has carried all three and the last block has run (4.5 + 1 s).
TEST(PlanCluster, ZeroBlockMovesWaitAsTheyAreIssued) {
  ASSERT_EQ(Zero2Pool::kInFlight, 1u);  // the hand timings below assume one reduce-scatter in flight
  const std::vector<BlockMoves> fast(3, BlockMoves{1.0, 2.0, 0.5, 0.5, 0.5, true});
  const ZeroWaits f = zero_block_waits(fast);
  EXPECT_DOUBLE_EQ(f.forward, 0.5);
  EXPECT_DOUBLE_EQ(f.backward, 0.5);
  EXPECT_DOUBLE_EQ(f.drain, 0.5);  // the last reduce-scatter, launched as the backward ends
  EXPECT_DOUBLE_EQ(f.hidden_forward, 1.0);   // 1.5 s of gathers, 0.5 waited
  EXPECT_DOUBLE_EQ(f.hidden_backward, 2.0);  // 1.5 s of gathers and 1.5 of reduce-scatters, 1.0 waited
  const std::vector<BlockMoves> slow(3, BlockMoves{1.0, 2.0, 1.5, 0.0, 0.0, true});
  const ZeroWaits s = zero_block_waits(slow);
  EXPECT_DOUBLE_EQ(s.forward, 2.5);
  EXPECT_DOUBLE_EQ(3 * 1.0 + s.forward, 3 * 1.5 + 1.0);
  EXPECT_DOUBLE_EQ(s.backward, 0.0);
  EXPECT_DOUBLE_EQ(s.drain, 0.0);
  // A block without parameters runs no hooks: it neither waits nor prefetches the next block's gather.
  std::vector<BlockMoves> gap = fast;
  gap[1] = BlockMoves{1.0, 2.0, 0.0, 0.0, 0.0, false};
  const ZeroWaits g = zero_block_waits(gap);
  EXPECT_DOUBLE_EQ(g.forward, 1.0);  // block 0's gather, then block 2's issued only when it starts
}

TEST(PlanCluster, OverlapHidesDataParallelCommunication) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  const std::vector<std::string> layout = {
      "model.n_layer=48",        "model.n_embd=7168",    "model.n_head=56",     "model.vocab_size=131072",
      "model.block_size=4096",   "parallel.tp=8",        "parallel.dp=48",      "parallel.sequence_parallel=true",
      "optimizer.zero=1",        "train.micro_batches=4", "train.batch_size=192"};
  auto with = [&](const char* overlap) {
    std::vector<std::string> s = layout;
    s.push_back(cat("parallel.overlap=", overlap));
    return predict_step(cl, load_config(src("configs/models/gpt3-175b.toml"), s));
  };
  const StepPrediction off = with("false"), on = with("true");
  EXPECT_NEAR(off.step_time_s, 1.60, 0.01);
  EXPECT_NEAR(off.exposed_comm_s, 0.93, 0.01);
  EXPECT_LT(on.step_time_s, off.step_time_s - 0.1);
  EXPECT_LT(on.exposed_comm_s, off.exposed_comm_s - 0.1);
  EXPECT_LT(on.dp_comm_exposed_s, off.dp_comm_exposed_s);
  // The tp / sp collectives: Relay's CUDA backend runs them in today's order (tp_overlaps), so on the H100 preset
  // (device.backend "cuda") none hides; a cluster whose backend runs them (the CPU's) hides some.
  EXPECT_EQ(off.tp_hidden_s, 0.0);
  EXPECT_EQ(on.tp_hidden_s, 0.0);
  EXPECT_DOUBLE_EQ(on.tp_cp_comm_s, off.tp_cp_comm_s);
  Cluster cpu_backend = cl;
  cpu_backend.device.backend = Device::cpu;
  std::vector<std::string> s_on = layout;
  s_on.push_back("parallel.overlap=true");
  const StepPrediction rings = predict_step(cpu_backend, load_config(src("configs/models/gpt3-175b.toml"), s_on));
  EXPECT_GT(rings.tp_hidden_s, 0.0);
  EXPECT_NEAR(rings.tp_cp_comm_s, off.tp_cp_comm_s - rings.tp_hidden_s, 1e-9);
  std::printf("32B on 384 H100: overlap off %.3f s (%.3f exposed, dp %.3f), on %.3f s (%.3f exposed, dp %.3f, "
              "tp / sp %.3f of it hidden)\n",
              off.step_time_s, off.exposed_comm_s, off.dp_comm_exposed_s, on.step_time_s, on.exposed_comm_s,
              on.dp_comm_exposed_s, on.tp_hidden_s);
}

// Context parallelism with parallel.overlap: each key/value all-gather hides behind the queries' attention to the
// rank's own rows, 1/cp of the rank's attention work; the gradients' reduce-scatter stays exposed. Llama 3 8B, 8192
// tokens over cp 2 inside a node (NVLink): both gathers are shorter than that part, so all of them hide (2/3 of cp's
// collectives, the three of the same bytes), and the step at least that much shorter; across nodes (tp 8 x cp 2) the
// gathers outlast it and only the attention's own-rows part of them hides.
TEST(PlanCluster, OverlapHidesContextParallelGathersBehindOwnRowsAttention) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  auto with = [&](std::vector<std::string> s, const char* overlap) {
    s.insert(s.end(), {"model.block_size=8192", "parallel.cp=2", "train.micro_batches=1", "train.batch_size=1",
                       cat("parallel.overlap=", overlap)});
    return predict_step(cl, load_config(src("configs/models/llama3-8b.toml"), s));
  };
  const StepPrediction off = with({}, "false"), on = with({}, "true");
  EXPECT_EQ(off.cp_hidden_s, 0.0);
  EXPECT_GT(on.cp_hidden_s, 0.0);
  EXPECT_NEAR(on.cp_hidden_s, 2.0 / 3.0 * off.tp_cp_comm_s, 1e-9 * off.tp_cp_comm_s);
  EXPECT_NEAR(on.tp_cp_comm_s, off.tp_cp_comm_s / 3.0, 1e-9 * off.tp_cp_comm_s);
  EXPECT_LT(on.step_time_s, off.step_time_s - on.cp_hidden_s);  // the dp x cp gradient reduction overlaps too
  const std::vector<std::string> across = {"parallel.tp=8", "parallel.sequence_parallel=true"};
  const StepPrediction off8 = with(across, "false"), on8 = with(across, "true");
  EXPECT_GT(on8.cp_hidden_s, 0.0);
  EXPECT_EQ(on8.tp_hidden_s, 0.0);  // sequence parallelism's collective matmuls: not on the CUDA backend (tp_overlaps)
  EXPECT_NEAR(on8.tp_cp_comm_s, off8.tp_cp_comm_s - on8.cp_hidden_s, 1e-9 * off8.tp_cp_comm_s);
  std::printf("Llama 3 8B T 8192 cp 2: hidden %.4f of %.4f s cp comm; tp 8 x cp 2: hidden %.4f of %.4f s tp+cp comm\n",
              on.cp_hidden_s, off.tp_cp_comm_s, on8.cp_hidden_s, off8.tp_cp_comm_s);
}

// Expert parallelism with parallel.overlap: a micro-batch's rows in two parts (each rank's first half of its experts,
// then the rest), part B's all-to-all travelling while part A's experts run (model/moe.cpp), so of the forward's pair
// (and the backward's) min(one all-to-all, the routed experts' GEMMs) hides; the row counts' exchange and the rest stay
// exposed. Mixtral 8x7B, dp 8 x pp 4, at ep 4 (two experts a rank; with recomputation the forward's pair runs again in
// the backward, hidden again) and at ep 8 (one expert a rank: one part, nothing hidden); overlap off keeps today's
// order.
TEST(PlanCluster, OverlapHidesExpertAllToAllsBehindTheOtherPartsExperts) {
  // The H100 preset's links with the CPU backend, whose expert layers run the two parts (ep_overlaps); on the
  // preset's own backend (CUDA: NCCL's all-to-alls in today's order) nothing hides.
  const Cluster gpu = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  Cluster cl = gpu;
  cl.device.backend = Device::cpu;
  auto with = [&](int ep, const char* overlap, const char* recompute, const Cluster& on_cluster) {
    return predict_step(on_cluster, load_config(src("configs/models/mixtral-8x7b.toml"),
                                        {"parallel.dp=8", cat("parallel.ep=", ep), "parallel.pp=4", "optimizer.zero=1",
                                         "train.micro_batches=8", "train.batch_size=64",
                                         cat("train.recompute=\"", recompute, "\""),
                                         cat("parallel.overlap=", overlap)}));
  };
  for (const char* recompute : {"none", "blocks"}) {
    const StepPrediction off = with(4, "false", recompute, cl), on = with(4, "true", recompute, cl);
    EXPECT_EQ(off.ep_hidden_s, 0.0);
    EXPECT_GT(on.ep_hidden_s, 0.0);
    // At most one all-to-all of each pair hides: under half of ep's communication (the counts' exchange never).
    EXPECT_LT(on.ep_hidden_s, 0.5 * off.ep_comm_s);
    EXPECT_NEAR(on.ep_comm_s, off.ep_comm_s - on.ep_hidden_s, 1e-9 * off.ep_comm_s);
    EXPECT_LT(on.step_time_s, off.step_time_s);
    std::printf("Mixtral 8x7B ep 4 (recompute %s): ep all-to-alls %.4f s a step, %.4f s of them hidden; step %.3f -> "
                "%.3f s\n", recompute, off.ep_comm_s, on.ep_hidden_s, off.step_time_s, on.step_time_s);
  }
  const StepPrediction off8 = with(8, "false", "none", cl), on8 = with(8, "true", "none", cl);
  EXPECT_EQ(on8.ep_hidden_s, 0.0);
  EXPECT_DOUBLE_EQ(on8.ep_comm_s, off8.ep_comm_s);
  EXPECT_EQ(with(4, "true", "none", gpu).ep_hidden_s, 0.0);
}

// Tensor parallelism with parallel.overlap and no sequence parallelism (Megatron's asynchronous input-gradient
// all-reduce): each backward all-reduce of a column-parallel input gradient travels while that layer's weight gradient
// is computed. One 32B-wide GPT block (C 7168) at tp 2 across two nodes, whose all-reduces outlast the GEMMs: what
// hides is exactly c_attn's and c_fc's weight-gradient GEMMs, and the backward is that much shorter; with overlap off
// or with B and W apart (zb-h1) nothing hides. Under sequence parallelism the collective matmul hides the forward's
// all-gathers, up to (tp - 1) / tp of the GEMMs they feed, and the reduce-scatters after the row-parallel GEMMs, up
// to (tp - 1) / tp of those; the backward's input-gradient reduce-scatters hide behind the same weight gradients as
// without it (not with B and W apart).
TEST(PlanCluster, OverlapHidesTensorParallelInputGradientAllReduces) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  const Config cfg = load_config(src("configs/models/gpt3-175b.toml"),
                                 {"model.n_layer=2", "model.n_embd=7168", "model.n_head=56", "parallel.tp=2"});
  const ModelLayout layout = make_layout(cfg, 0);
  const BlockSpec& b = layout.blocks()[1];
  ASSERT_EQ(b.kind, BlockKind::transformer);
  const double n = 4096, C = 7168;
  BlockContext ctx;
  ctx.rows = 4096;
  ctx.tp = 2;
  ctx.tp_path = group_path(cl, 2, cl.devices_per_node);  // one rank on each of two nodes
  const BlockTime off = block_time(cl.device, b, ctx);
  ctx.tp_overlap = true;
  const BlockTime on = block_time(cl.device, b, ctx);
  const double weight_grads = gemm_s(cl.device, Precision::bf16, C, 3 * C / 2, n) +  // c_attn's dW (3C/2, C) over n
                              gemm_s(cl.device, Precision::bf16, C, 4 * C / 2, n);   // c_fc's (4C/2, C)
  const double all_reduce = all_reduce_s(ctx.tp_path, 2.0 * n * C);  // one (n, C) bf16 input gradient
  ASSERT_GT(all_reduce, gemm_s(cl.device, Precision::bf16, C, 4 * C / 2, n));  // the case: the GEMMs hide under it
  EXPECT_EQ(off.tp_hidden, 0.0);
  EXPECT_NEAR(on.tp_hidden, weight_grads, 1e-12);
  EXPECT_NEAR(off.backward_input - on.backward_input, weight_grads, 1e-12);
  EXPECT_NEAR(off.comm_backward - on.comm_backward, weight_grads, 1e-12);
  ctx.split_backward = true;
  EXPECT_EQ(block_time(cl.device, b, ctx).tp_hidden, 0.0);
  ctx.split_backward = false;
  // Sequence parallelism: the forward's two all-gathers run as collective matmuls, each hidden up to (tp - 1) / tp
  // of the GEMM its chunks feed (c_attn's, c_fc's); here each gather outlasts that half.
  ctx.sequence_parallel = true;
  // Each GEMM of the ring runs as tp GEMMs of n / tp rows, priced so; what that costs more than the one GEMM is
  // added to the forward (chunking).
  auto chunked = [&](double N, double K) { return 2 * gemm_s(cl.device, Precision::bf16, n / 2, N, K); };
  auto chunking = [&](double N, double K) { return chunked(N, K) - gemm_s(cl.device, Precision::bf16, n, N, K); };
  const double feeds = chunked(3 * C / 2, C) + chunked(4 * C / 2, C);  // c_attn's and c_fc's forward GEMMs
  ASSERT_GT(all_gather_s(ctx.tp_path, 2.0 * n * C), chunked(4 * C / 2, C) / 2);
  const BlockTime sp_on = block_time(cl.device, b, ctx);
  ctx.tp_overlap = false;
  const BlockTime sp_off = block_time(cl.device, b, ctx);
  // And the backward's input-gradient reduce-scatters (the reduce-scatter half of each entry) travel behind c_attn's
  // and c_fc's weight gradients: min(reduce-scatter, dW) of each hidden; the gathers stay exposed.
  const double rs = reduce_scatter_s(ctx.tp_path, 2.0 * n * C);  // one (n, C) bf16 input gradient's
  const double backward_hidden = std::min(rs, gemm_s(cl.device, Precision::bf16, C, 3 * C / 2, n)) +
                                 std::min(rs, gemm_s(cl.device, Precision::bf16, C, 4 * C / 2, n));
  ASSERT_GT(backward_hidden, 0.0);
  ASSERT_LT(backward_hidden, 2 * rs + 1e-15);
  EXPECT_EQ(sp_off.tp_hidden, 0.0);
  // The forward's reduce-scatters run as collective matmuls too: each hidden up to (tp - 1) / tp of the row-parallel
  // GEMM whose chunks produce it (c_proj's (n, C, C / 2), the MLP's c_proj (n, C, 4C / 2)).
  const double rs_fwd = std::min(rs, chunked(C, C / 2) / 2) + std::min(rs, chunked(C, 4 * C / 2) / 2);
  const double chunking_s =
      chunking(3 * C / 2, C) + chunking(4 * C / 2, C) + chunking(C, C / 2) + chunking(C, 4 * C / 2);
  ASSERT_GT(rs_fwd, 0.0);
  ASSERT_GE(chunking_s, 0.0);
  // The backward's all-gathers (the output gradient's, d res1's) run as collective matmuls behind the row-parallel
  // layers' input gradients dX (n, K) = dY (n, C) W: the MLP's c_proj's (n, 4C / 2) and c_proj's (n, C / 2), chunked.
  const double ag = all_gather_s(ctx.tp_path, 2.0 * n * C);
  auto chunked_bi = [&](double K) { return 2 * gemm_s(cl.device, Precision::bf16, n / 2, K, C); };
  const double ag_bwd = std::min(ag, chunked_bi(C / 2) / 2) + std::min(ag, chunked_bi(4 * C / 2) / 2);
  const double chunking_bwd = chunked_bi(C / 2) - gemm_s(cl.device, Precision::bf16, n, C / 2, C) +
                              chunked_bi(4 * C / 2) - gemm_s(cl.device, Precision::bf16, n, 4 * C / 2, C);
  ASSERT_GT(ag_bwd, 0.0);
  EXPECT_NEAR(sp_on.tp_hidden, feeds / 2 + rs_fwd + backward_hidden + ag_bwd, 1e-12);
  EXPECT_NEAR(sp_off.forward - sp_on.forward, feeds / 2 + rs_fwd - chunking_s, 1e-12);
  EXPECT_NEAR(sp_off.backward_input - sp_on.backward_input, backward_hidden + ag_bwd - chunking_bwd, 1e-12);
  EXPECT_NEAR(sp_off.comm_backward - sp_on.comm_backward, backward_hidden + ag_bwd, 1e-12);
  ctx.tp_overlap = true;
  ctx.split_backward = true;  // zero-bubble: B and W apart, the reduce-scatters stay blocking (B runs the gathers)
  EXPECT_NEAR(block_time(cl.device, b, ctx).tp_hidden, feeds / 2 + rs_fwd + ag_bwd, 1e-12);
  std::printf("GPT block C 7168, 4096 rows, tp 2 across nodes: %.3f ms of %.3f ms backward all-reduces hidden; "
              "sequence parallel: %.3f ms of the all-gathers and reduce-scatters (forward reduce-scatters %.3f ms, "
              "backward %.3f ms, of %.3f ms each way; backward all-gathers %.3f ms of %.3f ms)\n",
              1e3 * on.tp_hidden, 1e3 * 2 * all_reduce, 1e3 * sp_on.tp_hidden, 1e3 * rs_fwd, 1e3 * backward_hidden,
              1e3 * 2 * rs, 1e3 * ag_bwd, 1e3 * 2 * ag);
}

// The named attention option: the (T, T) scores written to memory cost more than FlashAttention on the same layout,
// by more at a small width (more heads' scores per GEMM FLOP) than at a large one.
TEST(PlanCluster, MaterialisedAttentionCostsTheScoresTraffic) {
  const Cluster cl = load_cluster(src("configs/clusters/a100-80gb-sxm-hdr.toml"));
  auto slowdown = [&](int heads, int hidden) {
    const Config c = load_config(src("configs/models/gpt3-175b.toml"),
                                 {cat("model.n_head=", heads), cat("model.n_embd=", hidden), "model.n_layer=24",
                                  "parallel.dp=8", "train.batch_size=64", "train.micro_batches=8"});
    return predict_step(cl, c, false, PlannedAttention::materialised).step_time_s / predict_step(cl, c).step_time_s;
  };
  const double small = slowdown(24, 2304), large = slowdown(96, 12288);
  EXPECT_GT(small, 1.15);
  EXPECT_GT(large, 1.0);
  EXPECT_LT(large, small);
  std::printf("materialised / flash step: h 2304 %.3f, h 12288 %.3f\n", small, large);
}

// The named elementwise option: PyTorch eager's decomposed RMSNorm, RoPE, SwiGLU and f32 loss make a Llama's step
// longer than Relay's fused kernels do, by more at a small width (elementwise traffic grows as C, the GEMMs as C^2);
// GPT-2's LayerNorm and GELU are single kernels in eager too, so its step moves by the attention output's copy alone.
TEST(PlanCluster, EagerElementwiseCostsTheDecomposedKernels) {
  const Cluster cl = load_cluster(src("configs/clusters/a100-80gb-sxm-hdr.toml"));
  const PlannedKernels eager{PlannedAttention::flash, PlannedElementwise::eager};
  auto slowdown = [&](const char* model) {
    const Config c = load_config(src(cat("configs/", model, ".toml")),
                                 {"parallel.dp=8", "train.batch_size=8", "train.micro_batches=1"});
    return predict_step(cl, c, false, eager).step_time_s / predict_step(cl, c).step_time_s;
  };
  const double small = slowdown("smollm2-135m"), large = slowdown("models/llama3-70b"), gpt = slowdown("gpt2-124m");
  EXPECT_GT(large, 1.03);
  EXPECT_GT(small, large);
  EXPECT_GT(gpt, 1.0);
  EXPECT_LT(gpt, small);
  std::printf("eager / fused step: SmolLM2-135M %.3f, Llama 3 70B %.3f, GPT-2 124M %.3f\n", small, large, gpt);
}

// train.precision = "fp8" (issue 43): the linear layers' GEMMs at the device's FP8 peak plus their quantisation passes
// (activations and gradients per use, the weights once an optimizer step where their codes are cached, as
// model/fp8_linear.cpp does); faster than bf16 on an H100 for a large GPT, blockwise's single quantisation pass
// cheaper than tensorwise's two; a device without FP8 (the A100 preset) refused naming the key.
// A block's cached weights take their quantisation out of every micro-batch's forward and input gradient (the same
// seconds from each, the weights' bytes) into BlockTime::fp8_weights, once a step: with m micro-batches a step saves
// 2m - 1 weight quantisations (ZeRO-3, which keeps no codes, still quantises in every use).
TEST(PlanCluster, Fp8PlansAtTheFp8Peak) {
  const Cluster h100 = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  auto plan = [&](const Cluster& cl, const char* precision, const char* recipe) {
    std::vector<std::string> s = {"model.n_layer=8", "model.n_embd=8192", "model.n_head=64", "parallel.tp=8",
                                  "parallel.dp=1", "train.batch_size=8", "train.micro_batches=8",
                                  cat("train.precision=\"", precision, "\"")};
    if (recipe) s.push_back(cat("train.fp8_recipe=\"", recipe, "\""));
    return predict_step(cl, load_config(src("configs/models/gpt3-175b.toml"), s));
  };
  const StepPrediction bf16 = plan(h100, "bf16", nullptr), tensorwise = plan(h100, "fp8", "tensorwise"),
                       blockwise = plan(h100, "fp8", "blockwise");
  EXPECT_LT(tensorwise.step_time_s, bf16.step_time_s);
  EXPECT_LT(blockwise.step_time_s, tensorwise.step_time_s);
  EXPECT_GT(tensorwise.step_time_s, 0.5 * bf16.step_time_s);  // attention, norms, head and collectives stay
  std::printf("GPT 8 x 8192 at tp 8 on H100: bf16 %.4f s, fp8 tensorwise %.4f s (%.2fx), blockwise %.4f s (%.2fx)\n",
              bf16.step_time_s, tensorwise.step_time_s, bf16.step_time_s / tensorwise.step_time_s,
              blockwise.step_time_s, bf16.step_time_s / blockwise.step_time_s);
  {
    const ModelLayout layout = make_layout(load_config(src("configs/models/gpt3-175b.toml"),
                                                       {"model.n_layer=2", "model.n_embd=8192", "model.n_head=64",
                                                        "train.precision=\"fp8\""}),
                                           0);
    const BlockSpec& b = layout.blocks()[1];
    ASSERT_EQ(b.kind, BlockKind::transformer);
    ASSERT_TRUE(b.fp8.has_value());
    BlockContext ctx;
    ctx.rows = 8192, ctx.precision = Precision::fp8;
    const BlockTime per_use = block_time(h100.device, b, ctx);
    ctx.fp8_weights_cached = true;
    const BlockTime cached = block_time(h100.device, b, ctx);
    // The weights: c_attn 3C x C, c_proj C x C, c_fc 4C x C, c_proj C x 4C; tensorwise 5 bytes an element.
    const double C = 8192, weights = 12 * C * C;
    const double seconds = stream_s(h100.device, 5 * weights);
    EXPECT_EQ(per_use.fp8_weights, 0.0);
    EXPECT_NEAR(cached.fp8_weights, seconds, 1e-9 * seconds);
    EXPECT_NEAR(per_use.forward - cached.forward, seconds, 1e-9 * seconds);
    EXPECT_NEAR(per_use.backward_input - cached.backward_input, seconds, 1e-9 * seconds);
    EXPECT_EQ(per_use.backward_weight, cached.backward_weight);  // dy and x only
    std::printf("a GPT block of width 8192, 8192 rows, tensorwise: weights quantised %.3f ms a use; forward %.3f -> "
                "%.3f ms, input gradient %.3f -> %.3f ms a micro-batch\n", 1e3 * seconds, 1e3 * per_use.forward,
                1e3 * cached.forward, 1e3 * per_use.backward_input, 1e3 * cached.backward_input);
  }
  const Cluster a100 = load_cluster(src("configs/clusters/a100-80gb-sxm-hdr.toml"));
  try {
    plan(a100, "fp8", nullptr);
    FAIL() << "fp8 planned on a device without FP8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device.peak_fp8_flops"), std::string::npos) << e.what();
  }
}

// configs/models/deepseek-v3.toml as the planner sees it (no device, no search): every parameter counted once (the
// embedding and the untied output head both, no MTP module) against DeepSeek-V3's 671B, and the active ones (the
// routed experts' 8 of 256) against a count written out here from config.json (the report's "37B" is that figure
// rounded: 37.55B, 1.5% above it; without the embedding, which a token only reads, 36.63B). An MLA layer's forward
// FLOPs a token, dense (layer 0) and routed (layer 3), against a hand count: 2 x each projection's multiply-adds (q_a
// 7168 -> 1536, q_b 1536 -> 128 x 192, kv_a 7168 -> 576, kv_b 512 -> 128 x 256, o 128 x 128 -> 7168), QK^T over 192
// columns and att @ V over the narrower 128 (2 T H each, the whole sequence; the cost model halves it for causality),
// and the SwiGLU's 6 C F, or the router's 2 C E plus 6 C Fe for each of the 8 routed and the 1 shared expert; the
// layer's GEMMs (block_cost) add up to the same FLOPs. And the search plans sequence parallelism for its tp layouts
// as for every family's (mla_blocks.cpp runs it).
// The search reuses what a layout's shape (tp, cp, ep, pp, v) fixes, its model layout, stage parameters, bucket keys
// and checkpoint bytes (plan/layout_cache.hpp), across the layouts of that shape: every figure it predicts through the
// cache equals, bit for bit, a fresh prediction, for Mixtral 8x7B layouts that share shapes and differ in ZeRO stage
// (the bucket keys of ZeRO-2/3), recomputation, micro-batching and schedule, on the first and the last stage.
TEST(PlanCluster, SearchShapeCachePredictsAsFresh) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  const Config base = load_config(src("configs/models/mixtral-8x7b.toml"));
  struct Row { int dp, tp, ep, pp; const char* schedule; int v, zero; const char* recompute; int64_t m; };
  const Row rows[] = {
      {4, 1, 2, 4, "1f1b", 1, 1, "blocks", 256},  {4, 1, 2, 4, "zb-h1", 1, 0, "none", 128},
      {4, 1, 2, 4, "1f1b", 1, 3, "none", 128},    {4, 1, 2, 4, "interleaved", 2, 1, "none", 256},
      {4, 1, 2, 4, "interleaved", 2, 3, "blocks", 128}, {8, 2, 4, 1, "1f1b", 1, 2, "blocks", 32},
      {8, 2, 4, 1, "1f1b", 1, 3, "none", 64},     {8, 2, 4, 1, "1f1b", 1, 0, "blocks", 64},
  };
  LayoutCache cache;
  for (const Row& r : rows) {
    Config c = base;
    c.parallel.dp = r.dp, c.parallel.tp = r.tp, c.parallel.ep = r.ep, c.parallel.pp = r.pp;
    c.parallel.schedule = r.schedule, c.parallel.virtual_stages = r.v, c.parallel.sequence_parallel = r.tp > 1;
    c.optimizer.zero = r.zero, c.train.recompute = r.recompute, c.train.micro_batches = r.m;
    const StepPrediction a = predict_step(cl, c, cache.get(c)), b = predict_step(cl, c);
    SCOPED_TRACE(describe_layout(c));
    EXPECT_GT(a.step_time_s, 0);
    EXPECT_EQ(a.step_time_s, b.step_time_s);
    EXPECT_EQ(a.tokens_per_s_per_device, b.tokens_per_s_per_device);
    EXPECT_EQ(a.mfu, b.mfu);
    EXPECT_EQ(a.hardware_flops_per_s_per_device, b.hardware_flops_per_s_per_device);
    EXPECT_EQ(a.memory_bytes_per_device, b.memory_bytes_per_device);
    EXPECT_EQ(a.fits, b.fits);
    EXPECT_EQ(a.bubble_fraction, b.bubble_fraction);
    EXPECT_EQ(a.exposed_comm_s, b.exposed_comm_s);
    EXPECT_EQ(a.ep_comm_s, b.ep_comm_s);
    EXPECT_EQ(a.checkpoint_bytes, b.checkpoint_bytes);
  }
  EXPECT_EQ(cache.size(), 3u);  // (pp 4, v 1), (pp 4, v 2) and (tp 2, ep 4, pp 1): built once each
}

// DeepSeek-V3 671B on pp 16: the pipeline partition weighs the MTP block (its decoder layer, eh_proj and the second
// head pass, by FLOPs) like any block, so the last stage (MTP block + head) keeps fewer decoder layers with
// num_mtp_layers = 1 than without (1 and 2).
TEST(PlanCluster, DeepseekV3MtpMovesLayersOffTheLastStage) {
  int last_layers[2] = {0, 0};
  for (int mtp = 0; mtp < 2; ++mtp) {
    const Config c = load_config(src("configs/models/deepseek-v3.toml"), {cat("model.num_mtp_layers=", mtp)});
    const ModelSpec m = make_model_spec(c, 0);
    const std::vector<ChunkRange> parts = partition_blocks(m.blocks, 16, {}, {});
    ASSERT_EQ(parts.size(), 16u);
    for (int i = parts.back().begin; i < parts.back().end; ++i)
      last_layers[mtp] += m.blocks[size_t(i)].kind == BlockKind::mla_layer;
    EXPECT_EQ(m.blocks[size_t(parts.back().end - 2)].kind, mtp ? BlockKind::mtp : BlockKind::mla_layer);
  }
  EXPECT_EQ(last_layers[0], 2);
  EXPECT_EQ(last_layers[1], 1);
}

// `relay plan --config`'s per-rank memory table (predict_memory of every pipeline rank) and the cluster model's memory
// (StepPrediction::memory_bytes_per_device) agree: the cluster's is the table's largest rank, with ZeRO-3's gathered
// parameters and step gradients (printed beside the table), for the small DeepSeek-V3 with MTP on pp 2 and pp 4 (where
// a middle rank may hold the most; the cluster model once read the first and last ranks only), through the search's
// shape cache too.
TEST(PlanCluster, DeepseekV3MtpStageMemoryAgreesWithPlanConfig) {
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  struct Row { int pp, zero; const char* recompute; int64_t m; };
  for (const Row& r : {Row{2, 0, "none", 2}, Row{2, 1, "blocks", 4}, Row{2, 3, "none", 2}, Row{4, 0, "none", 4},
                       Row{4, 3, "blocks", 8}}) {
    const Config c = load_config(src("configs/deepseek-v3-small-bytes.toml"),
                                 {"model.num_mtp_layers=1", "model.n_layer=6", cat("parallel.pp=", r.pp),
                                  "parallel.dp=2", cat("optimizer.zero=", r.zero),
                                  cat("train.recompute=\"", r.recompute, "\""), cat("train.micro_batches=", r.m)});
    SCOPED_TRACE(describe_layout(c));
    const ModelLayout layout = make_layout(c, 0);
    double table = 0;
    for (int p = 0; p < r.pp; ++p) {
      const MemoryBytes b = predict_memory(c, layout, p, 0);
      table = std::max(table, double(b.total() + b.gathered + b.step_grads));
    }
    LayoutCache cache;
    EXPECT_EQ(predict_step(cl, c).memory_bytes_per_device, table);
    EXPECT_EQ(predict_step(cl, c, cache.get(c)).memory_bytes_per_device, table);
  }
}

// The memory term of the pipeline partition (parallel.stage_memory_gib): on pp 2 the small DeepSeek-V3 with MTP, a
// 4096-token vocabulary and 512-token sequences cut by compute alone leaves two decoder layers with the MTP block and
// the head, whose logits (twice: the head's and MTP's) make the last stage the larger; with a budget 10% under that
// stage's bytes the cut that fits moves the layers to the first stage, and every rank's planned memory is within it.
TEST(PlanCluster, DeepseekV3StageMemoryTermMovesLayersOffTheMtpStage) {
  std::vector<std::string> keys = {"model.num_mtp_layers=1", "model.n_layer=8", "model.block_size=512",
                                   "model.vocab_size=4096", "parallel.pp=2", "parallel.dp=1", "train.micro_batches=1"};
  auto layers_on_last = [](const ModelLayout& l) {
    int n = 0;
    for (int i = l.chunks.back().begin; i < l.chunks.back().end; ++i) n += l.blocks()[size_t(i)].kind == BlockKind::mla_layer;
    return n;
  };
  const Config by_compute = load_config(src("configs/deepseek-v3-small-bytes.toml"), keys);
  const ModelLayout before = make_layout(by_compute, 0);
  const double first = double(predict_memory(by_compute, before, 0, 0).total());
  const double last = double(predict_memory(by_compute, before, 1, 0).total());
  ASSERT_GT(last, 1.2 * first);  // the MTP block and the head's stage holds the most
  ASSERT_EQ(layers_on_last(before), 2);
  const double budget = 0.9 * last;
  keys.push_back(cat("parallel.stage_memory_gib=", budget / double(1 << 30)));
  const Config by_memory = load_config(src("configs/deepseek-v3-small-bytes.toml"), keys);
  const ModelLayout after = make_layout(by_memory, 0);
  EXPECT_EQ(layers_on_last(after), 0);
  EXPECT_EQ(after.blocks()[size_t(after.chunks.back().begin)].kind, BlockKind::mtp);
  for (int p = 0; p < 2; ++p) EXPECT_LE(double(predict_memory(by_memory, after, p, 0).total()), budget) << "pp rank " << p;
  // The cluster model plans the same cut and memory (through the search's cache as well).
  const Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  LayoutCache cache;
  const StepPrediction fresh = predict_step(cl, by_memory), cached = predict_step(cl, by_memory, cache.get(by_memory));
  EXPECT_LE(fresh.memory_bytes_per_device, budget);
  EXPECT_EQ(cached.memory_bytes_per_device, fresh.memory_bytes_per_device);
  EXPECT_EQ(cached.step_time_s, fresh.step_time_s);
  // A budget nothing fits: the cut by compute alone, as without the key.
  Config none = by_memory;
  none.parallel.stage_memory_gib = 0.5 * first / double(1 << 30);
  EXPECT_EQ(layers_on_last(make_layout(none, 0)), 2);
}

TEST(PlanCluster, SearchCutsStagesToFitTheDevice) {
  // One device a node on 2 nodes and one sequence a step: every layout is pp 2 (dp 1, tp 1). On a device 10% smaller
  // than the compute-balanced cut's MTP + head stage, the search's best layout is cut by the memory term
  // (parallel.stage_memory_gib = the device's usable GiB), which fits where the compute-balanced cut does not.
  const std::vector<std::string> keys = {"model.num_mtp_layers=1", "model.n_layer=8", "model.block_size=512",
                                         "model.vocab_size=4096", "train.batch_size=1", "train.micro_batches=1"};
  const Config base = load_config(src("configs/deepseek-v3-small-bytes.toml"), keys);
  Cluster cl = load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml"));
  cl.devices_per_node = 1;
  Config by_compute = base;
  by_compute.parallel.pp = 2;
  const StepPrediction before = predict_step(cl, by_compute);
  ASSERT_EQ(before.stage_memory_bytes.size(), 2u);
  const double usable = 0.9 * before.memory_bytes_per_device;
  cl.device.memory_bytes = cl.device.reserved_bytes + usable;
  const SearchResult r = search_layouts(cl, base, 2, 10);
  ASSERT_FALSE(r.best.empty());
  const PlannedLayout& best = r.best.front();
  EXPECT_EQ(best.cfg.parallel.pp, 2);
  EXPECT_EQ(best.cfg.parallel.virtual_stages, 1);
  EXPECT_NEAR(best.cfg.parallel.stage_memory_gib, usable / double(1 << 30), 1e-9);
  ASSERT_EQ(best.memory_cut.size(), 2u);
  EXPECT_TRUE(best.prediction.fits);
  ASSERT_EQ(best.prediction.stage_memory_bytes.size(), 2u);
  for (double b : best.prediction.stage_memory_bytes) EXPECT_LE(b, usable);
  EXPECT_NE(best.why.find("stages cut to fit the device"), std::string::npos) << best.why;
  // The same layout cut by compute alone overfills a stage; the memory term's cut is what a run of it makes.
  Config compute_cut = best.cfg;
  compute_cut.parallel.stage_memory_gib = 0;
  EXPECT_FALSE(predict_step(cl, compute_cut).fits);
  const ModelLayout run = make_layout(best.cfg, 0);
  ASSERT_EQ(run.chunks.size(), 2u);
  for (size_t c = 0; c < 2; ++c) EXPECT_EQ(run.chunks[c].end - run.chunks[c].begin, best.memory_cut[c]) << "stage " << c;
  const StepPrediction fresh = predict_step(cl, best.cfg, true);
  EXPECT_EQ(fresh.memory_bytes_per_device, best.prediction.memory_bytes_per_device);
  EXPECT_EQ(fresh.step_time_s, best.prediction.step_time_s);
}

TEST(PlanCluster, DeepseekV3ParametersAndMlaFlops) {
  const Config c = load_config(src("configs/models/deepseek-v3.toml"));
  const ModelSpec m = make_model_spec(c, 0);
  std::set<std::string> seen;
  double total = 0;
  for (const BlockSpec& b : m.blocks)
    for (const ParamSpec& p : b.params)
      if (seen.insert(p.name).second) total += double(shape_numel(p.shape));
  const double V = 129280, C = 7168, L = 61, H = 128, ql = 1536, r = 512, dn = 128, dr = 64, dv = 128, T = 4096;
  const double F = 18432, Fe = 2048, E = 256, k = 8, dense = 3;
  // Per layer: two norms over C, q_a and its norm, q_b, kv_a and its norm, kv_b, o.
  const double attn_params =
      2 * C + C * ql + ql + ql * H * (dn + dr) + C * (r + dr) + r + r * H * (dn + dv) + H * dv * C;
  const double expert = 3 * C * Fe, head = 2 * V * C + C;  // embedding, output head, final norm
  const double want_total = head + L * attn_params + dense * 3 * C * F + (L - dense) * (E * C + (1 + E) * expert);
  const double want_active = head + L * attn_params + dense * 3 * C * F + (L - dense) * (E * C + (1 + k) * expert);
  EXPECT_EQ(total, want_total);
  EXPECT_EQ(active_parameters(m), want_active);
  EXPECT_NEAR(total / 671e9, 1.0, 0.005);
  EXPECT_NEAR(active_parameters(m) / 37e9, 1.0, 0.016);
  std::printf("DeepSeek-V3: %.0f parameters (%.2fB), %.0f active (%.2fB)\n", total, total / 1e9,
              active_parameters(m), active_parameters(m) / 1e9);

  const double proj = 2 * (C * ql + ql * H * (dn + dr) + C * (r + dr) + r * H * (dn + dv) + H * dv * C);
  const double attention = 2 * T * H * (dn + dr) + 2 * T * H * dv;
  const double layer_flops[2] = {proj + attention + 6 * C * F, proj + attention + 2 * C * E + (k + 1) * 6 * C * Fe};
  for (int j = 0; j < 2; ++j) {
    const BlockSpec& b = m.blocks[size_t(j == 0 ? 1 : 4)];  // blocks[0] is the embedding: layers 0 and 3
    ASSERT_EQ(b.kind, BlockKind::mla_layer);
    ASSERT_EQ(b.moe.on(), j == 1);
    const BlockCost cost = block_cost(b, {}, 1);
    EXPECT_EQ(cost.forward_flops_per_row, layer_flops[j]) << "layer " << (j == 0 ? 0 : 3);
    EXPECT_EQ(cost.attention_flops_per_row, attention);
    EXPECT_EQ(cost.attention.value_dim(), 128);
    double gemm_flops = 0;
    for (const Gemm& g : cost.gemms) gemm_flops += 2 * g.M * g.N * g.K * g.count;
    EXPECT_NEAR(gemm_flops + attention, layer_flops[j], 1e-9 * layer_flops[j]) << "layer " << (j == 0 ? 0 : 3);
  }
  // The search on one node with the small DeepSeek-V3 (configs/deepseek-v3-small-bytes.toml): tp layouts among the
  // best, with sequence parallelism wherever tp divides the rows (search.cpp's rule: ModelFamily::sequence_parallel).
  const SearchResult s = search_layouts(load_cluster(src("configs/clusters/h100-80gb-sxm-ndr.toml")),
                                        load_config(src("configs/deepseek-v3-small-bytes.toml")), 1, 1000);
  int with_tp = 0;
  for (const PlannedLayout& l : s.best) {
    const int64_t tp = l.cfg.parallel.tp, rows = l.cfg.model.block_size / l.cfg.parallel.cp;
    EXPECT_EQ(l.cfg.parallel.sequence_parallel, tp > 1 && rows % tp == 0) << describe_layout(l.cfg);
    with_tp += l.cfg.parallel.tp > 1;
  }
  EXPECT_GT(with_tp, 0) << "no tp layout fits: the check above checks nothing";
}

}  // namespace
}  // namespace relay
