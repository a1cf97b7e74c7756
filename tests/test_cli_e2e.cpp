// End to end with the real binary: `relay data synth`, `relay data inspect`, `relay train` learns the
// set (eval accuracy >= 0.90, the stated threshold), and `relay plan` prints the grid and bubble.
#include <gtest/gtest.h>

#include "support/test_support.hpp"

using namespace relay::test;

TEST(EndToEnd, SynthThenTrainLearnsTheSet) {
  TempDir dir;
  std::string b = relay_binary();
  ASSERT_EQ(run_command(b + " data synth --out " + dir.file("train.h5") + " --samples 8192 --features 32 --classes 8 --seed 1").exit_code, 0);
  ASSERT_EQ(run_command(b + " data synth --out " + dir.file("eval.h5") + " --samples 2048 --features 32 --classes 8 --seed 2").exit_code, 0);
  RunResult i = run_command(b + " data inspect " + dir.file("train.h5"));
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_TRUE(contains(i.output, "[8192, 32]")) << i.output;
  write_file(dir.file("c.toml"), R"([run]
dir = ")" + dir.file("run") + R"("
[model]
layers = [ { type = "linear", out = 128 }, { type = "gelu" }, { type = "layernorm" }, { type = "linear", out = 128 }, { type = "gelu" }, { type = "linear", out = 8 } ]
[data]
train = ")" + dir.file("train.h5") + R"("
eval = ")" + dir.file("eval.h5") + R"("
[train]
steps = 400
batch_size = 128
log_every = 100
eval_every = 200
[optimizer]
lr = 3e-3
[lr_schedule]
name = "cosine"
warmup_steps = 20
)");
  RunResult r = run_command("OMP_NUM_THREADS=1 " + b + " train --config " + dir.file("c.toml"), 600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string metrics = read_file(dir.file("run") + "/metrics.jsonl");
  auto at = metrics.rfind("\"eval_accuracy\":");
  ASSERT_NE(at, std::string::npos) << metrics;
  double acc = std::stod(metrics.substr(at + 16));  // stod skips a space, if any
  EXPECT_GE(acc, 0.90) << r.output;
  EXPECT_TRUE(contains(r.output, "ETA")) << r.output;
  EXPECT_TRUE(contains(metrics, "\"samples_per_s\"")) << metrics;
}

TEST(EndToEnd, PlanPrintsGridBubbleAndPeakMemory) {
  TempDir dir;
  Problem p = make_problem(dir.path());
  RunResult r = run_command(relay_binary() + " plan --config " + p.config +
                            " --set parallel.pp=4 --set train.micro_batches=8 --set parallel.schedule='\"1f1b\"'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "bubble fraction 0.2727")) << r.output;  // (p-1)/(m+p-1) = 3/11
  EXPECT_TRUE(contains(r.output, "pp rank 0: busy")) << r.output;
  EXPECT_TRUE(contains(r.output, "peak micro-batches holding activations 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "F0")) << r.output;
  RunResult m = run_command(relay_binary() + " plan --measure --config " + p.config +
                            " --set parallel.pp=2 --set train.micro_batches=4 --set parallel.schedule='\"zb-h1\"'");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_TRUE(contains(m.output, "measured per-block times")) << m.output;
  EXPECT_TRUE(contains(m.output, "schedule with the measured costs")) << m.output;
}
