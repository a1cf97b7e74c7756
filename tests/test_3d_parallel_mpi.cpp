// Three-dimensional parallelism keeps Relay's guarantee: tensor parallelism (parallel.tp), ZeRO-1
// (optimizer.zero) and activation recomputation (train.recompute = "blocks"), alone and combined with
// data and pipeline parallelism, reproduce the serial run's losses and final tensors (parameters and
// AdamW state, gathered whole into the checkpoint) within |a - b| <= 1e-6 + 1e-5 |b|. The model is the
// GPT equivalence test's 4-layer GPT with 4 heads (so tp = 4 holds one head per rank) and a vocabulary
// of 61, which tp = 2 and 4 split unevenly. Checkpoints resume across layouts that change tp and ZeRO.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

constexpr double kRel = 1e-5, kAbs = 1e-6;

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  std::string schedule = "1f1b";
  int m = 1;
  bool zero = false;
  bool recompute = false;
  bool untied = false;
  int ranks() const { return dp * tp * pp; }
  std::string name() const {
    std::string s = "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_" +
                    schedule + "_m" + std::to_string(m) + (zero ? "_zero" : "") + (recompute ? "_recompute" : "") +
                    (untied ? "_untied" : "");
    for (auto& c : s) if (c == '-') c = '_';
    return s;
  }
  std::vector<std::string> overrides(const std::string& run) const {
    std::vector<std::string> ov = {"run.dir=" + quoted(run), "parallel.dp=" + std::to_string(dp),
                                   "parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
                                   "parallel.schedule=" + quoted(schedule), "train.micro_batches=" + std::to_string(m),
                                   "parallel.virtual_stages=" + std::to_string(schedule == "interleaved" ? 2 : 1),
                                   std::string("optimizer.zero=") + (zero ? "true" : "false"),
                                   "train.recompute=" + quoted(recompute ? "blocks" : "none"), "model.n_head=4"};
    if (untied) ov.push_back("model.tie_embeddings=false");
    return ov;
  }
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name(); }

std::vector<Layout> all_layouts() {
  std::vector<Layout> out;
  auto add = [&](int dp, int tp, int pp, std::string sched, int m, bool zero, bool rec, bool untied = false) {
    Layout l;
    l.dp = dp, l.tp = tp, l.pp = pp, l.schedule = std::move(sched), l.m = m, l.zero = zero, l.recompute = rec;
    l.untied = untied;
    out.push_back(l);
  };
  add(1, 2, 1, "1f1b", 1, false, false);
  add(1, 4, 1, "1f1b", 2, false, false);
  add(1, 2, 1, "1f1b", 1, false, false, true);    // untied head, vocabulary-parallel on its own
  add(2, 2, 1, "1f1b", 2, false, false);
  add(1, 2, 2, "1f1b", 4, false, false);           // tied embedding split over tp and across stages
  add(1, 2, 2, "zb-h1", 4, false, false);
  add(1, 2, 2, "interleaved", 4, false, false);
  add(2, 2, 2, "1f1b", 2, false, false);           // 8 ranks
  add(1, 4, 2, "gpipe", 2, false, false);          // 8 ranks
  add(2, 1, 1, "1f1b", 2, true, false);            // ZeRO-1
  add(4, 1, 1, "gpipe", 1, true, false);
  add(2, 1, 2, "1f1b", 2, true, false);            // ZeRO-1 with the tied pair across stages
  add(2, 2, 2, "1f1b", 2, true, false);            // all three
  add(2, 4, 1, "1f1b", 1, true, false);
  add(1, 1, 1, "1f1b", 2, false, true);            // recomputation
  add(1, 1, 2, "1f1b", 4, false, true);
  add(1, 1, 2, "interleaved", 4, false, true);
  add(2, 2, 2, "1f1b", 2, true, true);             // everything
  return out;
}

class ThreeD : public ::testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() {
    setenv("RELAY_VERIFY_TIED", "1", 1);  // tied copies (and tp-replicated parameters) checked bitwise
    dir_ = std::make_unique<TempDir>();
    problem_ = make_gpt_problem(dir_->path(), 4097, 61);
    for (bool untied : {false, true}) {
      Layout serial;
      serial.untied = untied;
      std::string run = dir_->file(untied ? "serial_untied" : "serial");
      RunResult r = train(1, problem_.config, serial.overrides(run));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      losses_[untied] = read_losses(run);
      tensors_[untied] = read_checkpoint(run + "/checkpoints/step_00000006.h5");
    }
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static std::unique_ptr<TempDir> dir_;
  static Problem problem_;
  static std::map<bool, std::vector<double>> losses_;
  static std::map<bool, std::map<std::string, std::vector<float>>> tensors_;
};
std::unique_ptr<TempDir> ThreeD::dir_;
Problem ThreeD::problem_;
std::map<bool, std::vector<double>> ThreeD::losses_;
std::map<bool, std::map<std::string, std::vector<float>>> ThreeD::tensors_;

TEST_P(ThreeD, MatchesSerialRun) {
  const Layout& l = GetParam();
  const std::string run = dir_->file(l.name());
  RunResult r = train(l.ranks(), problem_.config, l.overrides(run));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (l.tp > 1) EXPECT_TRUE(contains(r.output, " x tp " + std::to_string(l.tp) + " x ")) << r.output;
  if (l.zero) EXPECT_TRUE(contains(r.output, "ZeRO-1: each of the " + std::to_string(l.dp))) << r.output;
  if (l.recompute) EXPECT_TRUE(contains(r.output, "recomputing transformer blocks")) << r.output;
  auto losses = read_losses(run);
  const auto& ref = losses_[l.untied];
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(losses[i], ref[i], kAbs + kRel * std::abs(ref[i])) << "loss at step " << i + 1;
  auto tensors = read_checkpoint(run + "/checkpoints/step_00000006.h5");
  ASSERT_EQ(tensors.size(), tensors_[l.untied].size());
  expect_tensors_within(tensors, tensors_[l.untied], kRel, kAbs, "against the serial run");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ThreeD, ::testing::ValuesIn(all_layouts()),
                         [](const auto& info) { return info.param.name(); });

TEST(ThreeDDeterminism, TwoRunsOfOneLayoutAreBitwiseIdentical) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 4097, 61);
  Layout l;
  l.dp = 2, l.tp = 2, l.pp = 2, l.m = 2, l.zero = true, l.recompute = true;
  std::vector<std::map<std::string, std::vector<float>>> results;
  std::vector<std::vector<double>> losses;
  for (int k = 0; k < 2; ++k) {
    std::string run = dir.file("run" + std::to_string(k));
    RunResult r = train(l.ranks(), p.config, l.overrides(run));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    results.push_back(read_checkpoint(run + "/checkpoints/step_00000006.h5"));
    losses.push_back(read_losses(run));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(results[0] == results[1]) << "final tensors differ between two identical runs";
}

// A checkpoint written at one 3D layout resumes at another (tp and ZeRO changed both ways): the resumed
// steps 4-6 match the uninterrupted serial run.
TEST(ThreeDResume, AcrossTensorParallelAndZeroLayouts) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 4097, 61);
  Layout serial;
  const std::string ref_run = dir.file("serial");
  RunResult r = train(1, p.config, serial.overrides(ref_run));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ref_losses = read_losses(ref_run);
  const auto ref_tensors = read_checkpoint(ref_run + "/checkpoints/step_00000006.h5");
  struct Pair { Layout from, to; };
  Layout a, b, c, d, e;
  a.dp = 2, a.tp = 2, a.pp = 2, a.m = 2, a.zero = true;  // (2, 2, 2) with ZeRO-1
  b.pp = 4, b.m = 4;                                     // (1, 1, 4)
  c.dp = 4, c.tp = 2, c.zero = true;                     // (4, 2, 1) with ZeRO-1
  d.tp = 4, d.pp = 2, d.m = 2;                           // (1, 4, 2)
  e.dp = 2, e.zero = true, e.recompute = true;
  for (const Pair& pr : {Pair{a, b}, Pair{a, c}, Pair{c, serial}, Pair{d, e}, Pair{serial, a}}) {
    const std::string first = dir.file(pr.from.name() + "_then_" + pr.to.name());
    auto ov = pr.from.overrides(first);
    ov.push_back("checkpoint.every=3");
    r = train(pr.from.ranks(), p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string run = first + "_resumed";
    ov = pr.to.overrides(run);
    ov.push_back("checkpoint.resume=" + quoted(first + "/checkpoints/step_00000003.h5"));
    r = train(pr.to.ranks(), p.config, ov);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resumed from")) << r.output;
    auto losses = read_losses(run);  // steps 4-6
    ASSERT_EQ(losses.size(), 3u) << pr.from.name() << " -> " << pr.to.name();
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(losses[i], ref_losses[i + 3], kAbs + kRel * std::abs(ref_losses[i + 3]))
          << pr.from.name() << " -> " << pr.to.name() << ", step " << i + 4;
    expect_tensors_within(read_checkpoint(run + "/checkpoints/step_00000006.h5"), ref_tensors, kRel, kAbs,
                          pr.from.name() + " -> " + pr.to.name());
  }
}

TEST(ThreeDErrors, BadTensorParallelSettingsAreNamed) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 4097, 61);
  RunResult r = train(1, p.config, {"run.dir=" + quoted(dir.file("a")), "parallel.tp=3", "model.n_head=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "parallel.tp: = 3 must divide model.n_head = 4")) << r.output;
  r = train(2, p.config, {"run.dir=" + quoted(dir.file("b")), "parallel.tp=4", "model.n_head=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "parallel.dp x parallel.tp x parallel.pp = 1 x 4 x 1 = 4")) << r.output;
  r = train(1, p.config, {"run.dir=" + quoted(dir.file("c")), "train.recompute=\"blocks\"",
                          "parallel.schedule=\"zb-h1\""});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "train.recompute")) << r.output;
}

}  // namespace

namespace {

// <run>/memory.json: per rank, measured and predicted bytes by kind.
struct RankMemory {
  std::map<std::string, double> measured, predicted;
};
std::vector<RankMemory> read_memory(const std::string& run) {
  auto j = nlohmann::json::parse(read_file(run + "/memory.json"));
  std::vector<RankMemory> out;
  for (auto& r : j.at("bytes_per_rank")) {
    RankMemory m;
    for (auto& [k, v] : r.at("measured").items()) m.measured[k] = v.get<double>();
    for (auto& [k, v] : r.at("predicted").items()) m.predicted[k] = v.get<double>();
    out.push_back(m);
  }
  return out;
}

// Measured memory per rank matches relay plan's prediction, ZeRO-1 holds 1/dp of the optimizer state,
// and recomputation cuts activation memory by at least the predicted factor.
TEST(ThreeDMemory, MeasuredMatchesPredictedZeroShardsRecomputeCuts) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 4097, 61);
  auto run_layout = [&](const Layout& l) {
    const std::string run = dir.file("mem_" + l.name());
    auto ov = l.overrides(run);
    ov.push_back("train.steps=2");
    // An evaluation after the first step, before the report: it runs in the training's buffers and must add none.
    ov.push_back("train.eval_every=1");
    ov.push_back("lr_schedule.warmup_steps=1");
    RunResult r = train(l.ranks(), p.config, ov);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "memory per rank after the first step")) << r.output;
    EXPECT_TRUE(contains(r.output, "eval step      1")) << r.output;
    auto mem = read_memory(run);
    EXPECT_EQ(mem.size(), static_cast<size_t>(l.ranks()));
    for (size_t w = 0; w < mem.size(); ++w)
      for (const char* k : {"params", "grads", "optimizer", "activations"}) {
        const double got = mem[w].measured[k], want = mem[w].predicted[k];
        EXPECT_GT(want, 0) << l.name() << " rank " << w << " " << k;
        // ZeRO pads each bucket to a multiple of dp; bias-free blocks keep a zero vector or two.
        EXPECT_NEAR(got, want, 0.01 * want + 1024) << l.name() << " rank " << w << " " << k;
      }
    return mem;
  };
  Layout plain, zero, tp, rec, norec, gpipe, zb;
  plain.dp = 2, plain.m = 1;
  zero = plain, zero.zero = true;
  tp.dp = 2, tp.tp = 2, tp.pp = 2, tp.m = 2, tp.zero = true;
  norec.pp = 2, norec.m = 4;
  rec = norec, rec.recompute = true;
  gpipe = norec, gpipe.schedule = "gpipe";
  zb = norec, zb.schedule = "zb-h1";
  auto mp = run_layout(plain), mz = run_layout(zero);
  run_layout(tp);
  auto mn = run_layout(norec), mr = run_layout(rec), mg = run_layout(gpipe), mb = run_layout(zb);
  // 1F1B's first stage holds 2 of the 4 micro-batches at once, GPipe all 4: the slots follow the schedule.
  EXPECT_LT(mn[0].measured["activations"], 0.7 * mg[0].measured["activations"]);
  // ZB-H1 holds as many micro-batches as 1F1B but runs their B and W apart, so each block of each slot keeps its
  // backward buffers (10 of the GPT block's 25 C a row); 1F1B's blocks and slots share one set.
  for (size_t w = 0; w < mn.size(); ++w)
    EXPECT_GT(mb[w].measured["activations"], 1.2 * mn[w].measured["activations"]) << "rank " << w;
  for (size_t w = 0; w < mp.size(); ++w)
    EXPECT_NEAR(mz[w].measured["optimizer"] * 2, mp[w].measured["optimizer"], 64)
        << "rank " << w << ": ZeRO-1 optimizer state is not 1/dp of the unsharded state";
  for (size_t w = 0; w < mn.size(); ++w) {
    const double predicted = mn[w].predicted["activations"] / mr[w].predicted["activations"];
    const double measured = mn[w].measured["activations"] / mr[w].measured["activations"];
    // Recomputation keeps a block's input only; without it the blocks keep their forward intermediates (their
    // backward buffers are one shared set either way). Rank 1's vocabulary-wide head, never recomputed, dilutes it.
    EXPECT_GT(predicted, 1.25) << "rank " << w;
    EXPECT_GE(measured, predicted * 0.999) << "rank " << w;
  }
}

}  // namespace

namespace {

// Preemption under 3D parallelism: SIGTERM to one tensor-parallel rank mid-run ends every rank at a
// step boundary with a checkpoint (exit 75); resuming reproduces the uninterrupted run bitwise.
TEST(ThreeDPreemption, SigtermToATensorParallelRankThenResumeIsExact) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path(), 4097, 61);
  Layout l;
  l.dp = 2, l.tp = 2, l.pp = 2, l.m = 2, l.zero = true, l.recompute = true;
  auto long_run = [&](const std::string& run) {
    auto ov = l.overrides(run);
    ov.insert(ov.end(), {"train.steps=300", "train.log_every=1", "checkpoint.every=100"});
    return ov;
  };
  const std::string ref = dir.file("ref"), cut = dir.file("cut");
  RunResult r = train(8, p.config, long_run(ref), 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = signal_rank_midrun(8, p.config, long_run(cut), cut, 30, 5, "TERM");  // rank 5: stage 1, replica 0, tp 1
  ASSERT_TRUE(contains(r.output, "signalled")) << r.output;
  ASSERT_TRUE(contains(r.output, "exit=75")) << r.output;
  auto resume = long_run(cut);
  resume.push_back("checkpoint.resume=\"auto\"");
  r = train(8, p.config, resume, 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_losses(cut), read_losses(ref));
  expect_same_tensors(read_checkpoint(cut + "/checkpoints/step_00000300.h5"),
                      read_checkpoint(ref + "/checkpoints/step_00000300.h5"), 0.0, "after SIGTERM and resume");
}

}  // namespace
