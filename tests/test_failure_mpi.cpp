// Bad input ends the whole job with one clear line and a non-zero exit on every rank, never a hang:
// a world size that is not dp x pp, a bad balance, an error only one non-zero rank can see, a NaN
// loss, and bad config/data errors from the real binary.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {
std::string q(const std::string& s) { return "\"" + s + "\""; }
size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

class Failure : public ::testing::Test {
 protected:
  void SetUp() override { p_ = make_problem(dir_.path()); }
  RunResult run(int ranks, std::vector<std::string> ov) {
    ov.push_back("run.dir=" + q(dir_.file("run")));
    RunResult r = train(ranks, p_.config, ov, 60);
    EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    return r;
  }
  TempDir dir_;
  Problem p_;
};
}  // namespace

TEST_F(Failure, WorldSizeNotDpTimesPp) {
  RunResult r = run(3, {"parallel.dp=2", "parallel.pp=2"});
  EXPECT_TRUE(contains(r.output, "] error: the job has 3 ranks but parallel.dp x parallel.pp = 2 x 2 = 4"))
      << r.output;
  EXPECT_EQ(count(r.output, "error:"), 1u) << "one line, printed once:\n" << r.output;
}

TEST_F(Failure, BadBalance) {
  RunResult r = run(2, {"parallel.pp=2", "parallel.balance=[3, 3]"});
  EXPECT_TRUE(contains(r.output, "parallel.balance sums to 6 blocks but the model has 15")) << r.output;
  RunResult e = run(2, {"parallel.pp=2", "parallel.balance=[16]"});
  EXPECT_TRUE(contains(e.output, "parallel.balance has 1 entries but the pipeline has 2 stages")) << e.output;
}

TEST_F(Failure, ErrorSeenOnlyByANonZeroRank) {
  // The model has 3 outputs but the data holds classes 0..4: only the last stage (rank 1) reads targets.
  std::string cfg = read_file(p_.config);
  cfg.replace(cfg.find("linear\", out = 5"), 16, "linear\", out = 3");
  write_file(dir_.file("three.toml"), cfg);
  RunResult r = train(2, dir_.file("three.toml"), {"run.dir=" + q(dir_.file("run")), "parallel.pp=2"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, "] error: data.train:")) << r.output;
  EXPECT_TRUE(contains(r.output, "/targets")) << r.output;
  EXPECT_FALSE(contains(r.output, "[rank 0")) << r.output;
  EXPECT_TRUE(contains(r.output, "class index 3")) << r.output;
}

TEST_F(Failure, NanLossStopsEveryRank) {
  RunResult r = run(4, {"parallel.dp=2", "parallel.pp=2", "optimizer.name=\"sgd\"", "optimizer.lr=1e5",
                        "train.clip_grad_norm=0.0", "lr_schedule.warmup_steps=0"});
  EXPECT_TRUE(contains(r.output, "error: the loss is")) << r.output;
  EXPECT_EQ(count(r.output, "error:"), 1u) << r.output;
}

// train.skip_nonfinite = 2 with a learning rate that blows the weights up: once they overflow every later
// step is non-finite too (a skipped step leaves the weights as they were), so each layout skips two steps
// and then stops with the usual message and the limit, on every rank at the same step (no hang). GPT
// covers tensor parallelism and ZeRO-1, whose ranks hold only shards of the loss and the norm.
TEST_F(Failure, NonFiniteStepsSkippedThenStopOnEveryLayout) {
  const std::vector<std::string> blow_up = {"optimizer.name=\"sgd\"", "optimizer.lr=1e5", "train.clip_grad_norm=0.0",
                                            "lr_schedule.name=\"constant\"", "lr_schedule.warmup_steps=0",
                                            "train.steps=40", "train.skip_nonfinite=2"};
  auto check = [&](const RunResult& r, const std::string& layout) {
    EXPECT_EQ(count(r.output, "skipped: the loss is"), 2u) << layout << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "2 of at most 2 in a row (train.skip_nonfinite)")) << layout << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "after 2 consecutive skipped steps (train.skip_nonfinite = 2)")) << layout << "\n" << r.output;
    EXPECT_EQ(count(r.output, "error:"), 1u) << layout << "\n" << r.output;
  };
  std::vector<std::string> ov = blow_up;
  for (const char* k : {"parallel.dp=2", "parallel.pp=2"}) ov.push_back(k);
  check(run(4, ov), "MLP dp 2 x pp 2");
  std::filesystem::create_directories(dir_.file("gpt"));
  Problem g = make_gpt_problem(dir_.file("gpt"));
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {"parallel.tp=2", "parallel.pp=2"}, {"parallel.tp=2", "parallel.dp=2", "optimizer.zero=true"}}) {
    std::vector<std::string> o = blow_up;
    o[1] = "optimizer.lr=1e6";
    o.insert(o.end(), layout.begin(), layout.end());
    o.push_back("run.dir=" + q(dir_.file("gpt-" + layout[1])));
    RunResult r = train(4, g.config, o, 120);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
    check(r, "GPT " + layout[0] + " " + layout[1]);
  }
}

TEST_F(Failure, BadScheduleShapeNamesKeys) {
  RunResult r = run(2, {"parallel.pp=2", "parallel.schedule=\"interleaved\"", "parallel.virtual_stages=2",
                        "train.micro_batches=3"});
  EXPECT_TRUE(contains(r.output, "train.micro_batches")) << r.output;
  RunResult v = run(2, {"parallel.pp=2", "parallel.virtual_stages=2"});
  EXPECT_TRUE(contains(v.output, "parallel.virtual_stages")) << v.output;
  RunResult b = run(4, {"parallel.dp=4", "train.micro_batches=3"});
  EXPECT_TRUE(contains(b.output, "train.batch_size = 64 must be divisible by parallel.dp x train.micro_batches")) << b.output;
}

TEST_F(Failure, MissingDataAndBadConfig) {
  RunResult r = run(2, {"parallel.dp=2", "data.train=" + q(dir_.file("missing.h5"))});
  EXPECT_TRUE(contains(r.output, "data.train")) << r.output;
  EXPECT_TRUE(contains(r.output, "missing.h5")) << r.output;
  RunResult c = run(2, {"parallel.dp=2", "train.stpes=3"});
  EXPECT_TRUE(contains(c.output, "train.stpes: unknown key")) << c.output;
  EXPECT_EQ(count(c.output, "error:"), 1u) << c.output;
  RunResult s = run_command(relay_binary() + " train --config " + dir_.file("nope.toml"));
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_TRUE(contains(s.output, "cannot open")) << s.output;
}
