// ZeRO stages (optimizer.zero = 0 | 1 | 2; parallel/data_parallel.hpp). ZeRO-2 keeps only each rank's shard of the
// summed gradients: every bucket is reduce-scattered as the backward's last writer of it finishes, once per
// micro-batch, into pooled buffers of the largest bucket's size. The real binary trains the GPT problem's 4-layer
// GPT (tied embeddings: on pp 1 the embedding's bucket is written by the head first and the embedding last, and is
// reduce-scattered after each) and its Llama twin for 6 steps under mpirun on dp 2 and 4, beside tp, pp (every
// schedule, the tied pair of stages), cp, recomputation and a bf16 gradient wire, and compares every step's loss and
// gradient norm and every final tensor (parameters and AdamW state) with the serial run (|a - b| <= 1e-6 + 1e-5 |b|,
// as the other equivalence tests). With one micro-batch ZeRO-2 sums exactly what ZeRO-1 sums: bitwise equal, also
// over a bf16 wire. Two runs are bitwise; a ZeRO-2 checkpoint resumes on another dp without ZeRO. Memory per rank
// at dp 4 equals relay plan's prediction (1%) for stages 0, 1 and 2, and ZeRO-2's gradient bytes are the shard plus
// a few buckets. Bad stage values are named.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Case {
  std::string model;  // "gpt" or "llama"
  int zero = 2, dp = 2, tp = 1, pp = 1, cp = 1;
  std::string schedule = "1f1b";
  int m = 2;
  bool recompute = false, keep = false;  // keep: parallel.reshard_after_forward = false
  int ranks() const { return dp * cp * tp * pp; }
  std::string name() const {
    std::string s = model + "_zero" + std::to_string(zero) + "_dp" + std::to_string(dp) + "_tp" + std::to_string(tp) +
                    "_pp" + std::to_string(pp) + "_cp" + std::to_string(cp) + "_" + schedule + "_m" +
                    std::to_string(m) + (recompute ? "_recompute" : "") + (keep ? "_keep" : "");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<std::string> model_overrides(const std::string& model) {
  if (model == "gpt") return {"model.n_head=4"};
  return {"model.type=\"llama\"", "model.n_embd=32", "model.n_head=8", "model.n_kv_head=4", "model.ffn_hidden=48",
          "model.rope_theta=500.0", "model.norm_eps=1e-6"};
}

// Small buckets (about one block each), so that a step has many and the pool is reused.
const std::string kBuckets = "parallel.bucket_mb=0.004";

std::vector<std::string> case_overrides(const Case& c, const std::string& run) {
  auto ov = model_overrides(c.model);
  ov.insert(ov.end(), {"run.dir=" + quoted(run), "train.log_every=1", kBuckets, "parallel.dp=" + std::to_string(c.dp),
                       "parallel.cp=" + std::to_string(c.cp), "parallel.tp=" + std::to_string(c.tp),
                       "parallel.pp=" + std::to_string(c.pp), "parallel.schedule=" + quoted(c.schedule),
                       "parallel.virtual_stages=" + std::to_string(c.schedule == "interleaved" ? 2 : 1),
                       "train.micro_batches=" + std::to_string(c.m), "optimizer.zero=" + std::to_string(c.zero),
                       std::string("train.recompute=") + (c.recompute ? "\"blocks\"" : "\"none\""),
                       std::string("parallel.reshard_after_forward=") + (c.keep ? "false" : "true")});
  return ov;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  auto add = [&](Case c) { out.push_back(std::move(c)); };
  add({"gpt", 2, 2});
  add({"gpt", 2, 4, 1, 1, 1, "1f1b", 2});
  add({"gpt", 2, 2, 2});                               // tp 2
  add({"gpt", 2, 2, 1, 2, 1, "gpipe", 2});             // the tied embedding over two stages
  add({"gpt", 2, 2, 1, 2, 1, "1f1b", 4});
  add({"gpt", 2, 2, 1, 2, 1, "interleaved", 4});       // two chunks a rank
  add({"gpt", 2, 2, 1, 2, 1, "zb-h1", 4});             // weight gradients apart from the input gradients
  add({"gpt", 2, 2, 1, 1, 1, "1f1b", 2, true});        // recomputation
  add({"gpt", 2, 1, 1, 1, 2});                         // the replicas of cp 2
  add({"llama", 2, 2, 1, 1, 1, "1f1b", 2, true});
  add({"llama", 2, 2, 2, 2, 1, "1f1b", 2});            // dp x tp x pp
  // ZeRO-3: the same compositions; under pp > 1 a stage's parameters stay gathered for the step.
  const size_t two = out.size();
  for (size_t i = 0; i < two; ++i) {
    Case c = out[i];
    c.zero = 3;
    out.push_back(c);
  }
  Case keep{"gpt", 3, 2};
  keep.keep = true;
  add(keep);
  return out;
}

class ZeroStages : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path());
    for (std::string model : {"gpt", "llama"}) {
      const std::string run = dir_->file("serial_" + model);
      auto ov = model_overrides(model);
      ov.insert(ov.end(), {"run.dir=" + quoted(run), "train.log_every=1"});
      RunResult r = train(1, problem_.config, ov);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      serial_losses_[model] = read_losses(run);
      serial_norms_[model] = read_grad_norms(run);
      serial_tensors_[model] = read_checkpoint(run + "/checkpoints/step_00000006.h5");
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<std::string, std::vector<double>> serial_losses_, serial_norms_;
  static std::map<std::string, std::map<std::string, std::vector<float>>> serial_tensors_;
};
std::unique_ptr<TempDir> ZeroStages::dir_;
Problem ZeroStages::problem_;
std::map<std::string, std::vector<double>> ZeroStages::serial_losses_, ZeroStages::serial_norms_;
std::map<std::string, std::map<std::string, std::vector<float>>> ZeroStages::serial_tensors_;

TEST_P(ZeroStages, MatchesSerialRun) {
  const Case& c = GetParam();
  ASSERT_EQ(serial_losses_[c.model].size(), 6u);
  const std::string run = dir_->file(c.name());
  RunResult r = train(c.ranks(), problem_.config, case_overrides(c, run));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "ZeRO-" + std::to_string(c.zero) + ": each of the ")) << r.output;
  const auto losses = read_losses(run), norms = read_grad_norms(run);
  const auto &ref = serial_losses_[c.model], &ref_norms = serial_norms_[c.model];
  ASSERT_EQ(losses.size(), ref.size());
  ASSERT_EQ(norms.size(), ref_norms.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(losses[i], ref[i], kAbs + kRel * std::abs(ref[i])) << "loss at step " << i + 1;
    EXPECT_NEAR(norms[i], ref_norms[i], kAbs + kRel * std::abs(ref_norms[i])) << "grad norm at step " << i + 1;
  }
  expect_tensors_within(read_checkpoint(run + "/checkpoints/step_00000006.h5"), serial_tensors_[c.model], kRel, kAbs,
                        "against the serial run");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroStages, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// With one micro-batch and untied embeddings (a tied embedding's bucket is launched twice, after the head and after
// the embedding) ZeRO-2's and ZeRO-3's shards are 0 + the one reduce-scatter, ZeRO-1's sum: the same bits, over an
// fp32 and a bf16 wire (a bf16 round trip of a stray f32 sum would show). Two ZeRO-2 runs with micro-batches give the same bits.
// A ZeRO-2 checkpoint at step 3 resumes on dp 1 without ZeRO and equals the ZeRO-2 run's steps 4-6.
TEST(ZeroRuns, OneMicroBatchIsZeroOneBitwiseTwiceAndResumes) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  auto run_of = [&](const std::string& name, int ranks, std::vector<std::string> extra) {
    std::vector<std::string> ov = {"run.dir=" + quoted(dir.file(name)), "model.n_head=4", kBuckets,
                                   "checkpoint.every=3"};
    ov.insert(ov.end(), extra.begin(), extra.end());
    RunResult r = train(ranks, p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.file(name) + "/checkpoints/step_00000006.h5";
  };
  for (std::string wire : {"fp32", "bf16"}) {
    const std::string grad_reduce = "parallel.grad_reduce=" + relay::test::quoted(wire);
    const std::string untied = "model.tie_embeddings=false";
    const std::string one = run_of("z1_" + wire, 2, {"parallel.dp=2", "optimizer.zero=1", grad_reduce, untied});
    const std::string two = run_of("z2_" + wire, 2, {"parallel.dp=2", "optimizer.zero=2", grad_reduce, untied});
    expect_same_tensors(read_checkpoint(two), read_checkpoint(one), 0.0, "ZeRO-2 and ZeRO-1, one micro-batch, " + wire);
    // ZeRO-3 gathers the very values ZeRO-1 all-gathers after its update; its buckets (a block each) sum the same
    // two numbers per element.
    const std::string three = run_of("z3_" + wire, 2, {"parallel.dp=2", "optimizer.zero=3", grad_reduce, untied});
    expect_same_tensors(read_checkpoint(three), read_checkpoint(one), 0.0, "ZeRO-3 and ZeRO-1, one micro-batch, " + wire);
  }
  const std::string a = run_of("a", 2, {"parallel.dp=2", "optimizer.zero=2", "train.micro_batches=2"});
  const std::string b = run_of("b", 2, {"parallel.dp=2", "optimizer.zero=2", "train.micro_batches=2"});
  expect_same_tensors(read_checkpoint(a), read_checkpoint(b), 0.0, "two ZeRO-2 runs");
  const std::string a3 = run_of("a3", 2, {"parallel.dp=2", "optimizer.zero=3", "train.micro_batches=2"});
  const std::string b3 = run_of("b3", 2, {"parallel.dp=2", "optimizer.zero=3", "train.micro_batches=2"});
  expect_same_tensors(read_checkpoint(a3), read_checkpoint(b3), 0.0, "two ZeRO-3 runs");
  const std::string c = run_of("c", 1, {"optimizer.zero=0", "checkpoint.resume=" +
                                                                quoted(dir.file("a") + "/checkpoints/step_00000003.h5")});
  const auto la = read_losses(dir.file("a")), lc = read_losses(dir.file("c"));
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lc.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(lc[i], la[i + 3], kAbs + kRel * std::abs(la[i + 3])) << "step " << i + 4;
  expect_tensors_within(read_checkpoint(c), read_checkpoint(a), kRel, kAbs, "ZeRO-2 dp 2 resumed on dp 1");
}

// Measured bytes per rank at dp 4 equal relay plan's prediction (1%) for stages 0 to 3, and so does the step's peak
// of parameter bytes (ZeRO-3: its masters' pieces and the gathered blocks at their most). ZeRO-2's gradients are the
// shard plus a few buckets, well under ZeRO-1's whole gradients plus shard; ZeRO-3's parameters, gradients and
// optimizer state come within 1.1x of stage 0's over dp, plus the gathered blocks and the gradient buffers in flight
// (each about two blocks).
TEST(ZeroRuns, MemoryPerRankAsPlanned) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 8193, 96, 64);
  std::map<int, nlohmann::json> rank0;  // by stage
  for (int zero : {0, 1, 2, 3}) {
    const std::string run = dir.file("zero" + std::to_string(zero));
    RunResult r = train(4, p.config,
                        {"run.dir=" + quoted(run), "model.n_embd=64", "model.n_head=4", "model.n_layer=12", "parallel.dp=4",
                         "train.batch_size=8", "train.micro_batches=2", "parallel.bucket_mb=0.02", "train.steps=2",
                         "lr_schedule.warmup_steps=1", "data.eval=\"\"", "optimizer.zero=" + std::to_string(zero)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(read_file(run + "/memory.json"));
    ASSERT_EQ(j.at("bytes_per_rank").size(), 4u);
    for (auto& rank : j.at("bytes_per_rank"))
      for (const char* k : {"params", "grads", "optimizer", "activations", "peak_params"}) {
        const double got = rank.at("measured").at(k).get<double>(), want = rank.at("predicted").at(k).get<double>();
        EXPECT_NEAR(got, want, 0.01 * want + 1024) << "zero " << zero << " rank " << rank.at("rank") << " " << k;
      }
    rank0[zero] = j.at("bytes_per_rank")[0].at("measured");
  }
  auto at = [&](int zero, const char* k) { return rank0[zero].at(k).get<double>(); };
  auto states = [&](int zero) { return at(zero, "params") + at(zero, "grads") + at(zero, "optimizer"); };
  const double gathered = at(3, "peak_params") - at(3, "params");
  std::printf("bytes per rank at dp 4 (params, grads, optimizer; peak params):\n");
  for (int zero : {0, 1, 2, 3})
    std::printf("  zero %d: %9.0f %9.0f %9.0f; %9.0f\n", zero, at(zero, "params"), at(zero, "grads"),
                at(zero, "optimizer"), at(zero, "peak_params"));
  EXPECT_LT(at(2, "grads"), 0.6 * at(0, "grads"));
  EXPECT_GT(at(1, "grads"), at(0, "grads"));
  EXPECT_LT(at(3, "params"), 0.26 * at(0, "params"));  // 1/dp and the padding
  EXPECT_GT(gathered, 0.0);
  EXPECT_LE(states(3), 1.1 * states(0) / 4 + 2 * gathered) << "ZeRO-3 holds more than its shards and two blocks";
  EXPECT_LT(states(3) + gathered, 0.55 * (states(1) + at(1, "peak_params") - at(1, "params")));
}

// A rank killed (SIGKILL) inside a ZeRO-3 parameter all-gather ends the job within seconds, the launcher naming the
// rank (the uninterrupted run writes its checkpoints asynchronously); its newest checkpoint (step 4) resumes on dp 1 without ZeRO and continues the uninterrupted ZeRO-3 run
// exactly; and the other way round, the serial run's step-2 checkpoint resumes under ZeRO-3 on dp 2 x pp 2.
TEST(ZeroRuns, KilledInAGatherAndResumesAcrossStages) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  auto ov = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> o = {"run.dir=" + quoted(dir.file(name)), "model.n_head=4", "checkpoint.every=2",
                                  "parallel.timeout=\"3s\"", "train.log_every=1"};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  const std::vector<std::string> z3 = {"parallel.dp=2", "optimizer.zero=3", "train.micro_batches=2"};
  std::vector<std::string> async = z3;
  async.push_back("checkpoint.async=true");  // rank 0 gathers the pieces and a thread writes them
  RunResult a = train(2, p.config, ov("a", async));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  setenv("RELAY_TEST_KILL_RANK", "1", 1);
  setenv("RELAY_TEST_KILL_STEP", "5", 1);
  setenv("RELAY_TEST_KILL_WHERE", "zero3-gather", 1);
  const auto t0 = std::chrono::steady_clock::now();
  RunResult b = train(2, p.config, ov("b", z3), 120);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("RELAY_TEST_KILL_RANK");
  unsetenv("RELAY_TEST_KILL_STEP");
  unsetenv("RELAY_TEST_KILL_WHERE");
  EXPECT_NE(b.exit_code, 0) << b.output;
  EXPECT_LT(took, 30.0) << b.output;
  EXPECT_TRUE(contains(b.output, "rank 1") && contains(b.output, "signal 9")) << b.output;
  std::printf("killed in a ZeRO-3 all-gather: the job ended in %.1f s\n", took);
  const std::string c = dir.file("c");
  RunResult rc = train(1, p.config, ov("c", {"optimizer.zero=0", "checkpoint.resume=" +
                                             quoted(dir.file("b") + "/checkpoints/step_00000004.h5")}));
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  const auto la = read_losses(dir.file("a")), lc = read_losses(c);
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lc.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(lc[i], la[i + 4], kAbs + kRel * std::abs(la[i + 4])) << "step " << i + 5;
  expect_tensors_within(read_checkpoint(c + "/checkpoints/step_00000006.h5"),
                        read_checkpoint(dir.file("a") + "/checkpoints/step_00000006.h5"), kRel, kAbs,
                        "a ZeRO-3 checkpoint resumed on dp 1");
  RunResult s = train(1, p.config, ov("s", {}));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  RunResult d = train(4, p.config, ov("d", {"parallel.dp=2", "parallel.pp=2", "optimizer.zero=3", "train.micro_batches=2",
                                            "checkpoint.resume=" + quoted(dir.file("s") + "/checkpoints/step_00000002.h5")}));
  ASSERT_EQ(d.exit_code, 0) << d.output;
  expect_tensors_within(read_checkpoint(dir.file("d") + "/checkpoints/step_00000006.h5"),
                        read_checkpoint(dir.file("s") + "/checkpoints/step_00000006.h5"), kRel, kAbs,
                        "the serial run resumed under ZeRO-3 on dp 2 x pp 2");
}

// The MLP, whose activation blocks hold no parameters (a bucket's writers are the parameter blocks the backward
// visits one after another; ZeRO-3 prefetches only parameter blocks): dp 2 and dp 2 x pp 2 with ZeRO-2 and 3 and
// micro-batches equal the serial run.
TEST(ZeroRuns, MlpMatchesSerialRun) {
  TempDir dir;
  Problem p = make_problem(dir.path());
  const std::vector<std::string> common = {kBuckets, "checkpoint.every=6", "train.steps=6"};
  auto with = [&](const std::string& run, std::vector<std::string> extra) {
    extra.push_back("run.dir=" + quoted(dir.file(run)));
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  RunResult s = train(1, p.config, with("serial", {}));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  for (const char* zero : {"2", "3"})
    for (const char* pp : {"1", "2"}) {
      const std::string run = std::string("zero") + zero + "_pp" + pp;
      RunResult z = train(pp[0] == '2' ? 4 : 2, p.config,
                          with(run, {"parallel.dp=2", std::string("parallel.pp=") + pp, "train.micro_batches=2",
                                     std::string("optimizer.zero=") + zero}));
      ASSERT_EQ(z.exit_code, 0) << z.output;
      expect_tensors_within(read_checkpoint(dir.file(run) + "/checkpoints/step_00000006.h5"),
                            read_checkpoint(dir.file("serial") + "/checkpoints/step_00000006.h5"), kRel, kAbs,
                            "MLP " + run + " against the serial run");
    }
}

// Bad stage values, and a ZeRO-3 block too large to gather: one line naming the key, exit 1 on every rank.
TEST(ZeroRuns, BadStagesAreNamed) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"optimizer.zero=4", "optimizer.zero: must be a ZeRO stage 0, 1, 2 or 3, got 4"},
      {"optimizer.zero=\"two\"", "optimizer.zero: expected a ZeRO stage 0, 1, 2 or 3 (or true / false), got string"},
      {"parallel.reshard_after_forward=1", "parallel.reshard_after_forward: expected true or false, got integer"}};
  for (auto& [setting, message] : bad) {
    RunResult r = train(2, p.config, {"run.dir=" + quoted(dir.file("bad")), "parallel.dp=2", setting}, 60);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, message)) << r.output;
    EXPECT_EQ(count_of(r.output, "error:"), 1u) << r.output;
  }
  // An MLP layer of 400000 x 400000 (640 GB in fp32) can never be gathered: named before anything is allocated.
  Problem mlp = make_problem(dir.file("mlp"));
  RunResult r = train(2, mlp.config,
                      {"run.dir=" + quoted(dir.file("big")), "parallel.dp=2", "optimizer.zero=3",
                       "model.layers=[{ type = \"linear\", out = 400000 }, { type = \"linear\", out = 400000 }]"},
                      60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "optimizer.zero = 3: block 1 (linear) gathers 610353.1 MiB of parameters at once, "
                                 "but this rank can allocate")) << r.output;
  EXPECT_EQ(count_of(r.output, "error:"), 1u) << r.output;
}

}  // namespace
