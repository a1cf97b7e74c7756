// HDF5 checkpoints end to end with the real binary: exact resume, resume onto other layouts, every
// mismatch and corruption case, a crash before the rename, keep-K pruning, SIGTERM to one rank, and
// train.time_limit.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <filesystem>

#include "io/checkpoint.hpp"
#include "support/test_support.hpp"

using namespace relay::test;
namespace fs = std::filesystem;

namespace {

std::string q(const std::string& s) { return "\"" + s + "\""; }

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override { p_ = make_problem(dir_.path()); }
  std::string run(const std::string& name) const { return dir_.file(name); }
  TempDir dir_;
  Problem p_;
};

}  // namespace

TEST_F(Checkpoints, FormatRoundTripAndInspect) {
  RunResult r = train(1, p_.config, {"run.dir=" + q(run("a")), "checkpoint.save_initial=true", "checkpoint.every=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  relay::CheckpointReader c(run("a") + "/checkpoints/step_00000000.h5");
  EXPECT_EQ(c.meta().step, 0);
  EXPECT_EQ(c.meta().dp, 1);
  EXPECT_EQ(c.meta().optimizer, "adamw");
  EXPECT_NE(c.meta().config_toml.find("[model]"), std::string::npos);
  auto t = read_checkpoint(run("a") + "/checkpoints/step_00000006.h5");
  EXPECT_EQ(t.count("model/0.weight"), 1u);
  EXPECT_EQ(t.count("model/5.weight"), 1u);  // layernorm
  EXPECT_EQ(t.count("optimizer/exp_avg/14.bias"), 1u);
  EXPECT_EQ(t.count("optimizer/exp_avg_sq/0.weight"), 1u);
  EXPECT_EQ(relay::read_latest(run("a") + "/checkpoints"), "step_00000006.h5");
  RunResult i = run_command(relay_binary() + " ckpt inspect " + run("a") + "/checkpoints/step_00000006.h5");
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_TRUE(contains(i.output, "step 6")) << i.output;
  EXPECT_TRUE(contains(i.output, "model/0.weight")) << i.output;
  EXPECT_TRUE(contains(i.output, "[24, 16]")) << i.output;
  // The effective config and metrics are in run.dir.
  EXPECT_TRUE(fs::exists(run("a") + "/config.toml"));
  EXPECT_EQ(read_losses(run("a")).size(), 6u);
}

TEST_F(Checkpoints, ExactResumeSameLayoutIsBitwise) {
  const std::vector<std::string> layout = {"parallel.dp=2", "parallel.pp=2", "train.micro_batches=2"};
  auto with = [&](std::vector<std::string> v, std::vector<std::string> more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  RunResult full = train(4, p_.config, with(layout, {"run.dir=" + q(run("full")), "checkpoint.every=3"}));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  RunResult res = train(4, p_.config, with(layout, {"run.dir=" + q(run("res")),
                                                    "checkpoint.resume=" + q(run("full") + "/checkpoints/step_00000003.h5")}));
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_TRUE(contains(res.output, "resumed from")) << res.output;
  auto a = read_losses(run("full")), b = read_losses(run("res"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);  // steps 4..6
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[i + 3], b[i]) << "step " << i + 4;
  expect_same_tensors(read_checkpoint(run("full") + "/checkpoints/step_00000006.h5"),
                      read_checkpoint(run("res") + "/checkpoints/step_00000006.h5"), 0.0, "final checkpoint");
}

TEST_F(Checkpoints, ResumeOntoOtherLayouts) {
  RunResult full = train(4, p_.config, {"run.dir=" + q(run("full")), "parallel.dp=2", "parallel.pp=2",
                                        "train.micro_batches=2", "checkpoint.every=3"});
  ASSERT_EQ(full.exit_code, 0) << full.output;
  auto ref_losses = read_losses(run("full"));
  auto ref_final = read_checkpoint(run("full") + "/checkpoints/step_00000006.h5");
  const std::string from = q(run("full") + "/checkpoints/step_00000003.h5");
  struct L { int dp, pp; std::string sched; int m; int v; };
  for (L l : {L{1, 4, "1f1b", 4, 1}, L{4, 1, "gpipe", 2, 1}, L{1, 1, "1f1b", 1, 1}, L{1, 2, "interleaved", 4, 2}, L{2, 2, "zb-h1", 2, 1}}) {
    std::string name = "to_" + std::to_string(l.dp) + "x" + std::to_string(l.pp) + l.sched;
    RunResult r = train(l.dp * l.pp, p_.config,
                        {"run.dir=" + q(run(name)), "parallel.dp=" + std::to_string(l.dp), "parallel.pp=" + std::to_string(l.pp),
                         "parallel.schedule=" + q(l.sched), "train.micro_batches=" + std::to_string(l.m),
                         "parallel.virtual_stages=" + std::to_string(l.v), "checkpoint.resume=" + from});
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    auto losses = read_losses(run(name));
    ASSERT_EQ(losses.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(losses[i], ref_losses[i + 3], 1e-6 + 1e-5 * ref_losses[i + 3]) << name;
    expect_same_tensors(read_checkpoint(run(name) + "/checkpoints/step_00000006.h5"), ref_final, 1e-5, name);
  }
}

TEST_F(Checkpoints, MismatchesAreClearErrorsBeforeTraining) {
  RunResult base = train(1, p_.config, {"run.dir=" + q(run("base"))});
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const std::string ck = run("base") + "/checkpoints/step_00000006.h5";
  auto expect_error = [&](const std::vector<std::string>& ov, const std::string& needle, int ranks = 1) {
    std::vector<std::string> all = {"run.dir=" + q(run("bad"))};
    all.insert(all.end(), ov.begin(), ov.end());
    if (ranks == 2) all.push_back("parallel.pp=2");
    RunResult r = train(ranks, p_.config, all, 60);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out: " << r.output;
    EXPECT_TRUE(contains(r.output, needle)) << "expected '" << needle << "' in:\n" << r.output;
    EXPECT_FALSE(contains(r.output, "step      1 |")) << "training started:\n" << r.output;
  };
  // Another width: names the tensor and both shapes.
  std::string cfg = read_file(p_.config);
  std::string wide = cfg;
  wide.replace(wide.find("out = 24"), 8, "out = 32");
  write_file(dir_.file("wide.toml"), wide);
  {
    RunResult r = train(2, dir_.file("wide.toml"), {"run.dir=" + q(run("bad")), "parallel.pp=2", "checkpoint.resume=" + q(ck)}, 60);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "model/0.weight has shape [24, 16] in the checkpoint but the model expects [32, 16]"))
        << r.output;
  }
  expect_error({"optimizer.name=\"sgd\"", "checkpoint.resume=" + q(ck)}, "written with optimizer \"adamw\"");
  expect_error({"checkpoint.resume=" + q(p_.data)}, "not a Relay checkpoint");
  expect_error({"checkpoint.resume=" + q(p_.config)}, "not an HDF5 file");
  expect_error({"checkpoint.resume=" + q(dir_.file("nope.h5"))}, "no such file");
  // Truncated in the middle.
  fs::copy_file(ck, dir_.file("cut.h5"));
  fs::resize_file(dir_.file("cut.h5"), fs::file_size(ck) / 2);
  expect_error({"checkpoint.resume=" + q(dir_.file("cut.h5"))}, "truncated", 2);
  // A newer format version.
  fs::copy_file(ck, dir_.file("v2.h5"));
  {
    hid_t f = H5Fopen(dir_.file("v2.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
    int64_t two = 2;
    H5Awrite(a, H5T_NATIVE_INT64, &two);
    H5Aclose(a);
    H5Fclose(f);
  }
  expect_error({"checkpoint.resume=" + q(dir_.file("v2.h5"))}, "format version 2 is newer");
  // `relay ckpt inspect` rejects the cut file too.
  RunResult i = run_command(relay_binary() + " ckpt inspect " + dir_.file("cut.h5"));
  EXPECT_NE(i.exit_code, 0);
}

TEST_F(Checkpoints, CrashBeforeRenameLeavesLatestIntactAndResumes) {
  RunResult ref = train(1, p_.config, {"run.dir=" + q(run("ref"))});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  RunResult crash = run_command("RELAY_FAULT_CRASH_BEFORE_RENAME=4 " + relay_binary() + " train --config " + p_.config +
                                " --set run.dir=" + q(run("c")) + " --set checkpoint.every=2");
  EXPECT_EQ(crash.exit_code, 86) << crash.output;
  const std::string dir = run("c") + "/checkpoints";
  EXPECT_EQ(relay::read_latest(dir), "step_00000002.h5");
  EXPECT_FALSE(fs::exists(dir + "/step_00000004.h5"));
  EXPECT_EQ(run_command(relay_binary() + " ckpt inspect " + dir + "/step_00000002.h5").exit_code, 0);
  RunResult res = train(1, p_.config, {"run.dir=" + q(run("c")), "checkpoint.every=2", "checkpoint.resume=\"auto\""});
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_TRUE(contains(res.output, "step_00000002.h5 at step 2")) << res.output;
  EXPECT_EQ(read_losses(run("c")), read_losses(run("ref")));  // every step exactly once, same losses
  expect_same_tensors(read_checkpoint(dir + "/step_00000006.h5"), read_checkpoint(run("ref") + "/checkpoints/step_00000006.h5"),
                      0.0, "after crash and resume");
}

TEST_F(Checkpoints, KeepPrunesOnlyAfterTheNewOneIsComplete) {
  RunResult r = train(1, p_.config, {"run.dir=" + q(run("k")), "checkpoint.every=1", "checkpoint.keep=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(run("k") + "/checkpoints")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"latest", "step_00000005.h5", "step_00000006.h5"}));
}

TEST_F(Checkpoints, AutoResumeStartsFreshWithoutLatest) {
  RunResult r = train(1, p_.config, {"run.dir=" + q(run("fresh")), "checkpoint.resume=\"auto\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from"));
  EXPECT_EQ(read_losses(run("fresh")).size(), 6u);
}

namespace {
// A longer run of the same problem for the stop tests: 1500 steps, checkpoint every 500.
std::vector<std::string> long_run(const std::string& dir) {
  return {"run.dir=\"" + dir + "\"", "train.steps=1500", "checkpoint.every=500", "parallel.dp=2", "parallel.pp=2",
          "train.micro_batches=2", "lr_schedule.warmup_steps=10"};
}
}  // namespace

TEST_F(Checkpoints, SigtermToOneRankCheckpointsEverywhereAndResumes) {
  RunResult ref = train(4, p_.config, long_run(run("ref")), 600);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Start the job, wait for 50 logged steps, then SIGTERM world rank 2 only.
  RunResult r = signal_rank_midrun(4, p_.config, long_run(run("s")), run("s"), 50, 2, "TERM");
  ASSERT_TRUE(contains(r.output, "signalled")) << r.output;
  ASSERT_TRUE(contains(r.output, "exit=75")) << r.output;
  // Rank 0 names the signal that only rank 2 received (the ranks' stop votes carry its number).
  ASSERT_TRUE(contains(r.output, "on signal 15; checkpoint written")) << r.output;
  std::string latest = relay::read_latest(run("s") + "/checkpoints");
  ASSERT_FALSE(latest.empty());
  EXPECT_NE(latest, "step_00001500.h5");
  std::vector<std::string> resume = long_run(run("s"));
  resume.push_back("checkpoint.resume=\"auto\"");
  RunResult res = train(4, p_.config, resume, 600);
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_EQ(read_losses(run("s")), read_losses(run("ref")));  // every step once, the uninterrupted losses
  expect_same_tensors(read_checkpoint(run("s") + "/checkpoints/step_00001500.h5"),
                      read_checkpoint(run("ref") + "/checkpoints/step_00001500.h5"), 0.0, "after SIGTERM and resume");
}

TEST_F(Checkpoints, TimeLimitStopsWithResumableExitCode) {
  std::vector<std::string> ov = long_run(run("t"));
  ov.push_back("train.steps=1000000");
  ov.push_back("train.time_limit=\"3s\"");
  RunResult r = train(4, p_.config, ov, 120);
  EXPECT_EQ(r.exit_code, 75) << r.output;
  EXPECT_TRUE(contains(r.output, "train.time_limit")) << r.output;
  EXPECT_FALSE(relay::read_latest(run("t") + "/checkpoints").empty());
}
