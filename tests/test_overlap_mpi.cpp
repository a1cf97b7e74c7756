// Communication overlap (parallel.overlap, issue 40; docs/parallelism.md#communication-overlap): with it on, a progress
// thread moves the gradient collectives while the rank computes, and each ZeRO-0/1 bucket's all-reduce /
// reduce-scatter is launched as soon as the last micro-batch's backward has filled it. The real binary trains the GPT
// problem (small buckets, about one block each) on dp 2 with ZeRO 0, 1, 2 and 3 and on pp 2 x dp 2, overlap on and off:
// the same buckets summed by the same collectives, so every step's loss and gradient norm and every final tensor are
// bitwise equal, and two runs with overlap are bitwise. (ZeRO-1 and 2 with overlap also leave the parameter all-gather
// after the update in flight until the next forward reads the bucket, or an evaluation or checkpoint needs it: both
// come every few steps here. ZeRO-3 keeps the head's gathered parameters from its forward into its backward, traced
// as one gather fewer.) Its trace shows the difference: with overlap a bucket's
// all-reduce begins before the step's last backward ends; without, every one begins after it. A rank stopped (SIGSTOP)
// or killed (SIGKILL) right after it starts a bucket's all-reduce inside the backward, a tp input gradient's all-reduce
// or an ep dispatch still ends the job within seconds, named: the progress thread neither hides the stall from the watchdog nor keeps the job alive. On tp 2
// (zero0_dp1_pp1_m2_tp2) overlap hides each column-parallel input gradient's all-reduce behind the layer's weight
// gradients (Megatron's asynchronous all-reduce): the same sums, so on and off are bitwise equal there too. With
// sequence parallelism (..._tp2_sp) the forward's gathers run as collective matmuls and the backward's input-gradient
// reduce-scatters travel while the weight gradients are computed, their operands re-gathered into a second buffer
// meanwhile: bitwise as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

using namespace relay::test;

namespace {

struct Case {
  int zero = 0, dp = 2, pp = 1, m = 2, tp = 1;
  bool sp = false;  // parallel.sequence_parallel
  int ranks() const { return dp * pp * tp; }
  std::string name() const {
    return "zero" + std::to_string(zero) + "_dp" + std::to_string(dp) + "_pp" + std::to_string(pp) + "_m" +
           std::to_string(m) + (tp > 1 ? "_tp" + std::to_string(tp) : "") + (sp ? "_sp" : "");
  }
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

struct Outcome {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> tensors;
  // Per rank, in step 2: the end of its last backward span and the begin of its earliest bucket all-reduce (us).
  std::map<int, double> last_backward_end, first_allreduce_begin;
  bool exposed_reported = false;  // every window's exposed_comm_s in metrics.jsonl and the end table's column
  // Per rank, in step 2: the optimizer span [begin, end) and its parameter all-gathers (ZeRO-1/2, 3): bucket and issue
  // time, in issue order.
  std::map<int, std::pair<double, double>> optimizer;
  std::map<int, std::vector<std::pair<int, double>>> gathers;
};

Outcome train_run(const Problem& p, const std::string& run, const Case& c, bool overlap) {
  RunResult r = train(c.ranks(), p.config,
                      {"run.dir=" + quoted(run), "model.n_head=4", "train.log_every=1", "parallel.bucket_mb=0.004",
                       "parallel.dp=" + std::to_string(c.dp), "parallel.pp=" + std::to_string(c.pp),
                       "parallel.tp=" + std::to_string(c.tp),
                       std::string("parallel.sequence_parallel=") + (c.sp ? "true" : "false"),
                       "train.micro_batches=" + std::to_string(c.m), "optimizer.zero=" + std::to_string(c.zero),
                       std::string("parallel.overlap=") + (overlap ? "true" : "false"), "trace.steps=[2, 2]",
                       "checkpoint.every=2", "train.eval_every=3"});
  Outcome out;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return out;
  out.losses = read_losses(run);
  out.norms = read_grad_norms(run);
  out.tensors = read_checkpoint(run + "/checkpoints/step_00000006.h5");
  out.exposed_reported = count_of(read_file(run + "/metrics.jsonl"), "\"exposed_comm_s\":") == 6 &&
                         contains(r.output, "exposed comm ms");
  const auto j = nlohmann::json::parse(read_file(run + "/trace.json"));
  for (const auto& e : j.at("traceEvents")) {
    const int rank = e.value("pid", -1);
    if (e["ph"] == "X" && (e["args"]["op"] == "backward" || e["args"]["op"] == "backward_weight")) {
      const double end = e["ts"].get<double>() + e["dur"].get<double>();
      out.last_backward_end[rank] = std::max(out.last_backward_end[rank], end);
    }
    if (e["ph"] == "X" && e["args"]["op"] == "optimizer_step" && e["args"]["step"] == 2)
      out.optimizer[rank] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    if (e["ph"] == "b" && e["args"]["op"] == "gather_params" && e["args"]["step"] == 2) {  // ZeRO-1/2 and 3
      const std::string name = e["name"];  // "param gather bucket 7"
      out.gathers[rank].push_back({std::stoi(name.substr(name.rfind(' ') + 1)), e["ts"].get<double>()});
    }
    if (e["ph"] == "b" && e["args"]["op"] == "allreduce_grads") {
      const double ts = e["ts"].get<double>();
      auto it = out.first_allreduce_begin.find(rank);
      if (it == out.first_allreduce_begin.end() || ts < it->second) out.first_allreduce_begin[rank] = ts;
    }
  }
  return out;
}

class Overlap : public ::testing::TestWithParam<Case> {};

TEST_P(Overlap, OnAndOffBitwiseEqual) {
  const Case& c = GetParam();
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  const Outcome on = train_run(p, dir.file("on"), c, true), off = train_run(p, dir.file("off"), c, false);
  ASSERT_EQ(on.losses.size(), 6u);
  EXPECT_EQ(on.losses, off.losses) << "every step's loss, overlap on and off";
  EXPECT_EQ(on.norms, off.norms) << "every step's gradient norm, overlap on and off";
  expect_same_tensors(on.tensors, off.tensors, 0.0, "overlap on and off, " + c.name());
  EXPECT_TRUE(on.exposed_reported && off.exposed_reported) << "exposed_comm_s in metrics.jsonl and the end table";
  if ((c.zero == 1 || c.zero == 2) && c.pp == 1) {
    // ZeRO-1/2: each bucket's parameter all-gather is traced, issued inside the optimizer's span (with overlap on,
    // right after the bucket's own update), in the order the next forward reads them: the backward-filled buckets
    // last to first.
    for (const Outcome* o : {&on, &off}) {
      ASSERT_EQ(o->gathers.size(), size_t(c.ranks())) << "traced parameter all-gathers on every rank";
      for (auto& [rank, g] : o->gathers) {
        ASSERT_GE(g.size(), 2u) << "rank " << rank;
        auto sorted = g;
        std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second < b.second; });
        for (size_t i = 0; i < sorted.size(); ++i) {
          EXPECT_GE(sorted[i].second, o->optimizer.at(rank).first) << "rank " << rank << ": issued before the step";
          EXPECT_LE(sorted[i].second, o->optimizer.at(rank).second) << "rank " << rank << ": issued after it";
          if (i > 0) EXPECT_LT(sorted[i].first, sorted[i - 1].first) << "rank " << rank << ": not in forward order";
        }
      }
    }
  }
  if (c.zero == 3) {
    // ZeRO-3 on one stage gathers each block's parameters for its forward and again for its backward, except the
    // last block's (the head's), kept from its forward into its backward: its own unit is gathered once a
    // micro-batch, and the tied embedding's three times (the embedding's forward, the head's, the embedding's
    // backward), not twice and four times.
    for (const Outcome* o : {&on, &off})
      for (auto& [rank, g] : o->gathers) {
        std::map<int, int> times;  // bucket -> gathers in step 2
        for (auto& [bucket, at] : g) ++times[bucket];
        int least = 1 << 30, most = 0;
        for (auto& [bucket, n] : times) least = std::min(least, n), most = std::max(most, n);
        EXPECT_EQ(least, c.m) << "rank " << rank << ": the head's backward gathered its parameters again";
        EXPECT_EQ(most, 3 * c.m) << "rank " << rank << ": the tied embedding's gathers";
      }
    return;
  }
  if (c.zero == 2 || c.dp == 1) return;  // ZeRO-2 reduce-scatters each bucket as it fills, either way; dp 1: none
  ASSERT_EQ(on.first_allreduce_begin.size(), size_t(c.ranks())) << "a traced bucket all-reduce on every rank";
  for (const auto& [rank, end] : off.last_backward_end)
    EXPECT_GE(off.first_allreduce_begin.at(rank), end) << "overlap off: rank " << rank << " reduced during the backward";
  if (c.pp == 1)  // (under pp > 1 a stage's last backward may come after its chunk's buckets went out either way)
    for (const auto& [rank, end] : on.last_backward_end)
      EXPECT_LT(on.first_allreduce_begin.at(rank), end)
          << "overlap on: rank " << rank << "'s first bucket all-reduce waited for the whole backward";
}

INSTANTIATE_TEST_SUITE_P(Layouts, Overlap,
                         ::testing::Values(Case{0, 2, 1, 2}, Case{1, 2, 1, 2}, Case{2, 2, 1, 2}, Case{3, 2, 1, 2},
                                           Case{1, 2, 2, 4},
                                           Case{0, 1, 1, 2, 2}, Case{0, 1, 1, 2, 2, true}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

TEST(OverlapRuns, TwoRunsBitwise) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  const Case c{1, 2, 1, 2};
  const Outcome a = train_run(p, dir.file("a"), c, true), b = train_run(p, dir.file("b"), c, true);
  ASSERT_EQ(a.losses.size(), 6u);
  EXPECT_EQ(a.losses, b.losses);
  expect_same_tensors(a.tensors, b.tensors, 0.0, "two runs with overlap");
}

// RELAY_TEST_KILL_WHERE=<site>-stop | <site>-kill (core/test_faults.hpp): world rank 1 raises the signal right after
// it starts a collective that travels on the progress thread while the ranks compute, in step 3: the first bucket
// all-reduce (ZeRO-0 dp 2, inside the backward, rank 0's copy of it in flight), a column-parallel input gradient's
// all-reduce during the weight gradients (tp 2), a MoE layer's dispatch all-to-all (Mixtral dp 2 x ep 2, in two parts),
// a key/value all-gather started before the attention of the rank's own keys (cp 2).
TEST(OverlapRuns, RankStoppedOrKilledInFlightEndsTheJob) {
  TempDir dir;
  Problem p = make_gpt_problem(dir.path());
  const std::vector<std::string> ep = {"parallel.dp=2", "parallel.ep=2", "model.type=\"mixtral\"", "model.n_embd=32",
                                       "model.n_kv_head=2", "model.n_experts=4", "model.experts_per_token=2",
                                       "model.moe_ffn_hidden=24"};
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"bucket-stop", {"parallel.dp=2"}}, {"bucket-kill", {"parallel.dp=2"}}, {"tp-stop", {"parallel.tp=2"}},
      {"ep-kill", ep}, {"cp-kill", {"parallel.cp=2"}}};
  for (const auto& [where, layout] : cases) {
    setenv("RELAY_TEST_KILL_RANK", "1", 1);
    setenv("RELAY_TEST_KILL_STEP", "3", 1);
    setenv("RELAY_TEST_KILL_WHERE", where.c_str(), 1);
    std::vector<std::string> ov = {"run.dir=" + quoted(dir.file(where)), "model.n_head=4", "parallel.bucket_mb=0.004",
                                   "train.micro_batches=2", "parallel.timeout=\"2s\"", "parallel.overlap=true"};
    ov.insert(ov.end(), layout.begin(), layout.end());
    const auto t0 = std::chrono::steady_clock::now();
    RunResult r = train(2, p.config, ov, 120);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unsetenv("RELAY_TEST_KILL_RANK");
    unsetenv("RELAY_TEST_KILL_STEP");
    unsetenv("RELAY_TEST_KILL_WHERE");
    EXPECT_LT(took, 30.0) << where << ": " << r.output;
    if (where.ends_with("-stop")) {
      EXPECT_EQ(r.exit_code, 74) << where << ": " << r.output;  // a stalled rank (kExitStalled)
      EXPECT_TRUE(contains(r.output, "rank 1") && contains(r.output, "made no progress for") &&
                  contains(r.output, "at step 3"))
          << where << ": " << r.output;
      if (where == "tp-stop")  // the wait is named ("... waited for the attention input-gradient all-reduce")
        EXPECT_TRUE(contains(r.output, "input-gradient all-reduce at step 3")) << r.output;
    } else {
      EXPECT_NE(r.exit_code, 0) << where << ": " << r.output;
      EXPECT_TRUE(contains(r.output, "rank 1") && contains(r.output, "signal 9")) << where << ": " << r.output;
    }
    std::printf("%s in an overlapped collective: the job ended in %.1f s\n", where.c_str(), took);
  }
}

}  // namespace
