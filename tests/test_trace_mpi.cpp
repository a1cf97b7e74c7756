// Measured timelines ([trace] steps) from the real binary on 4 ranks (dp 2 x pp 2): trace.json is a
// Chrome trace-event file holding every rank (named with its stage and replica) and, for every traced
// step, every micro-batch's forward and backward (and, under ZB-H1, backward-weight) in exactly the
// order of that rank's schedule, with no two spans overlapping on one track, and every gradient
// bucket's all-reduce (launch to completion, async spans since they overlap). `relay plan --trace`
// writes the simulated schedule in the same format.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "parallel/schedule.hpp"
#include "support/test_support.hpp"

using namespace relay;
using namespace relay::test;

namespace {

struct Span {
  double ts, dur;
  std::string op;
  int mb, chunk;
  int64_t step;
};

void check_trace(const std::string& schedule, int m) {
  TempDir dir;
  Problem p = make_problem(dir.path());
  const std::string run = dir.file("run");
  RunResult r = train(4, p.config, {"run.dir=\"" + run + "\"", "parallel.dp=2", "parallel.pp=2",
                                    "parallel.schedule=\"" + schedule + "\"", "train.micro_batches=" + std::to_string(m),
                                    "trace.steps=[2, 3]"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "measured bubble")) << r.output;
  const auto j = nlohmann::json::parse(read_file(run + "/trace.json"));
  std::map<int, int> bucket_allreduces;  // rank -> async all-reduce spans begun
  std::map<int, std::string> names;
  std::map<std::pair<int, int>, std::vector<Span>> tracks;  // (rank, track) -> spans
  for (const auto& e : j.at("traceEvents")) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "b" && e["args"]["op"] == "allreduce_grads") ++bucket_allreduces[e["pid"].get<int>()];
    if (e["ph"] != "X") continue;
    const auto& a = e["args"];
    tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
        {e["ts"].get<double>(), e["dur"].get<double>(), a["op"], a["micro_batch"], a["chunk"], a["step"]});
  }
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[3], "rank 3 (stage 1, replica 1)");
  const ScheduleShape shape{parse_schedule_kind(schedule), 2, 1, m};
  for (int rank = 0; rank < 4; ++rank) {
    for (int tid = 0; tid < 3; ++tid) {  // no overlap on one track
      auto spans = tracks[{rank, tid}];
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
      for (size_t i = 1; i < spans.size(); ++i)
        EXPECT_LE(spans[i - 1].ts + spans[i - 1].dur, spans[i].ts + 0.01)
            << "rank " << rank << " track " << tid << ": " << spans[i - 1].op << " overlaps " << spans[i].op;
    }
    // The compute spans of each traced step, in time order, are the schedule's compute actions.
    std::vector<std::string> want;
    for (const Action& a : generate_schedule(shape, rank / 2))
      if (a.op == Op::forward || a.op == Op::backward || a.op == Op::backward_input || a.op == Op::backward_weight)
        want.push_back(cat(op_name(a.op), " mb ", a.micro_batch, " chunk ", a.chunk));
    for (int64_t step : {2, 3}) {
      std::vector<Span> compute;
      for (const Span& s : tracks[{rank, 0}])
        if (s.step == step && s.mb >= 0) compute.push_back(s);
      std::sort(compute.begin(), compute.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
      std::vector<std::string> got;
      for (const Span& s : compute) got.push_back(cat(s.op, " mb ", s.mb, " chunk ", s.chunk));
      EXPECT_EQ(got, want) << "rank " << rank << " step " << step;
    }
    EXPECT_FALSE((tracks[{rank, 2}].empty())) << "no data-wait spans on rank " << rank;
    EXPECT_GE(bucket_allreduces[rank], 2) << "each traced step's gradient-bucket all-reduces on rank " << rank;
  }
  // Nothing outside the traced steps.
  for (auto& [key, spans] : tracks)
    for (const Span& s : spans) EXPECT_TRUE(s.step == 2 || s.step == 3) << "a span of step " << s.step;
  // The simulated schedule, same format.
  RunResult plan = run_command(relay_binary() + " plan --config " + p.config + " --set parallel.pp=2 --set parallel.dp=2" +
                               " --set 'parallel.schedule=\"" + schedule + "\"' --set train.micro_batches=" +
                               std::to_string(m) + " --trace " + dir.file("plan.json"));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  const auto pj = nlohmann::json::parse(read_file(dir.file("plan.json")));
  int forwards = 0;
  for (const auto& e : pj.at("traceEvents")) forwards += e["ph"] == "X" && e["args"]["op"] == "forward";
  EXPECT_EQ(forwards, 2 * m) << "every micro-batch forward on both pipeline ranks";
}

}  // namespace

TEST(Trace, OneFOneBSpansFollowTheSchedule) { check_trace("1f1b", 4); }
TEST(Trace, ZeroBubbleSpansIncludeWeightGradients) { check_trace("zb-h1", 4); }
