// Pipeline schedules and their simulator: every schedule over a table of sizes is accepted, the
// simulator reproduces the published bubbles (GPipe arXiv:1811.06965, Megatron arXiv:2104.04473,
// Zero Bubble arXiv:2401.10241), and broken hand-made lists are rejected with a message that says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "parallel/schedule.hpp"
#include "parallel/slot_plan.hpp"
#include "parallel/simulator.hpp"

namespace relay {
namespace {

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                      ScheduleKind::zb_h1};
constexpr int kPipelineSizes[] = {1, 2, 3, 4, 8};
constexpr int kMicroBatches[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr double kTol = 1e-9;

bool valid(const ScheduleShape& s) {
  try {
    validate_schedule_shape(s);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string describe(const ScheduleShape& s) {
  return cat(schedule_kind_name(s.kind), " pp=", s.pp, " v=", s.v, " m=", s.m);
}

// Every valid shape of the table: pp x m x v in {1, 2, 3}, for each kind. m includes multiples of 3
// so that interleaved runs on 3 ranks too.
std::vector<ScheduleShape> table() {
  std::vector<ScheduleShape> shapes;
  for (ScheduleKind kind : kAllKinds) {
    for (int pp : kPipelineSizes) {
      for (int m : kMicroBatches) {
        for (int v : {1, 2, 3}) {
          if (valid({kind, pp, v, m})) shapes.push_back({kind, pp, v, m});
        }
      }
    }
  }
  return shapes;
}

double total(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Runs f, expects an exception of type E whose message holds every piece.
template <typename E>
void expect_error(const std::function<void()>& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << pieces.front() << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& piece : pieces) {
      EXPECT_NE(msg.find(piece), std::string::npos) << "missing '" << piece << "' in:\n" << msg;
    }
  }
}

void expect_invalid(const ScheduleShape& s, const std::vector<std::string>& pieces) {
  SCOPED_TRACE(describe(s));
  expect_error<Error>([&] { validate_schedule_shape(s); }, pieces);
}

void expect_rejected(const ScheduleShape& s, const std::vector<std::vector<Action>>& lists,
                     const std::vector<std::string>& pieces) {
  expect_error<ScheduleError>([&] { simulate(s, lists, Costs{}); }, pieces);
}

Action forward(int c, int mb) { return {Op::forward, c, mb}; }
Action backward(int c, int mb) { return {Op::backward, c, mb}; }
Action backward_input(int c, int mb) { return {Op::backward_input, c, mb}; }
Action send_activation(int c, int mb) { return {Op::send_activation, c, mb}; }
Action recv_activation(int c, int mb) { return {Op::recv_activation, c, mb}; }
Action send_grad(int c, int mb) { return {Op::send_grad, c, mb}; }
Action recv_grad(int c, int mb) { return {Op::recv_grad, c, mb}; }
Action allreduce_grads(int c) { return {Op::allreduce_grads, c, -1}; }
Action optimizer_step() { return {Op::optimizer_step, -1, -1}; }

// ---- names and validation ------------------------------------------------------------------------

TEST(ScheduleKind, ParsesEveryNameAndBack) {
  for (ScheduleKind kind : kAllKinds) EXPECT_EQ(parse_schedule_kind(schedule_kind_name(kind)), kind);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::one_f_one_b);
  EXPECT_EQ(parse_schedule_kind("zb-h1"), ScheduleKind::zb_h1);
  expect_error<Error>([] { parse_schedule_kind("1F1B"); }, {"parallel.schedule", "\"1F1B\"", "\"zb-h1\""});
}

TEST(ScheduleKind, ActionsPrintTheirFields) {
  EXPECT_STREQ(op_name(Op::backward_weight), "backward_weight");
  EXPECT_EQ(to_string(recv_grad(3, 7)), "recv_grad(chunk 3, mb 7)");
  EXPECT_EQ(to_string(allreduce_grads(2)), "allreduce_grads(chunk 2)");
  EXPECT_EQ(to_string(optimizer_step()), "optimizer_step");
}

TEST(ValidateScheduleShape, NamesTheKeysOfEachMistake) {
  using K = ScheduleKind;
  expect_invalid({K::one_f_one_b, 0, 1, 4}, {"parallel.pp", ">= 1", "got 0"});
  expect_invalid({K::one_f_one_b, 2, 0, 4}, {"parallel.virtual_stages", "got 0"});
  expect_invalid({K::gpipe, 2, 1, 0}, {"train.micro_batches", "got 0"});
  expect_invalid({K::one_f_one_b, 2, 2, 4},
                 {"parallel.virtual_stages = 2", "parallel.schedule = \"interleaved\"", "\"1f1b\""});
  expect_invalid({K::interleaved, 1, 2, 4}, {"parallel.pp >= 2", "got parallel.pp = 1"});
  expect_invalid({K::interleaved, 4, 1, 4}, {"parallel.virtual_stages >= 2"});
  expect_invalid({K::interleaved, 4, 2, 6},
                 {"train.micro_batches", "multiple of parallel.pp", "= 6", "= 4", "parallel.virtual_stages = 2"});
  expect_invalid({K::zb_h1, 4, 1, 3}, {"\"zb-h1\"", "train.micro_batches >= parallel.pp", "= 3", "= 4"});
  // gpipe and 1f1b run any m >= 1, also fewer micro-batches than ranks.
  EXPECT_NO_THROW(validate_schedule_shape({K::gpipe, 8, 1, 1}));
  EXPECT_NO_THROW(validate_schedule_shape({K::one_f_one_b, 8, 1, 1}));
  expect_error<Error>([] { generate_schedule({K::one_f_one_b, 2, 1, 4}, 2); }, {"pipeline rank 2", "parallel.pp = 2"});
}

// ---- every generated schedule --------------------------------------------------------------------

TEST(GenerateSchedule, EveryShapeOfTheTableIsAcceptedBySimulator) {
  const auto shapes = table();
  EXPECT_GE(shapes.size(), 60u);  // the table must not silently shrink
  for (const ScheduleShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    EXPECT_NO_THROW(simulate(s, generate_all(s), Costs{}));
    Costs slow_links;
    slow_links.comm = 0.37;
    EXPECT_NO_THROW(simulate(s, generate_all(s), slow_links));
  }
}

TEST(GenerateSchedule, IsDeterministicAndEachRankGetsItsOwnList) {
  for (const ScheduleShape& s : table()) {
    SCOPED_TRACE(describe(s));
    const auto all = generate_all(s);
    ASSERT_EQ(all.size(), static_cast<size_t>(s.pp));
    for (int rank = 0; rank < s.pp; ++rank) {
      EXPECT_EQ(generate_schedule(s, rank), all[rank]);
      for (const Action& a : all[rank]) {
        if (a.op != Op::optimizer_step) {
          EXPECT_EQ(chunk_rank(s, a.chunk), rank) << to_string(a);
        }
      }
    }
    EXPECT_EQ(generate_all(s), all);
  }
}

TEST(GenerateSchedule, OneRankHasNoMessages) {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
    const auto list = generate_schedule({kind, 1, 1, 4}, 0);
    for (const Action& a : list) {
      EXPECT_TRUE(a.op != Op::send_activation && a.op != Op::recv_activation && a.op != Op::send_grad &&
                  a.op != Op::recv_grad)
          << schedule_kind_name(kind) << ": " << to_string(a);
    }
  }
}

// allreduce_grads(c) follows chunk c's last weight gradient, with at most that action's send_grad in
// between, and optimizer_step closes every list.
TEST(GenerateSchedule, AllReduceFollowsLastWeightGradientAndOptimizerStepIsLast) {
  for (const ScheduleShape& s : table()) {
    SCOPED_TRACE(describe(s));
    for (const auto& list : generate_all(s)) {
      ASSERT_FALSE(list.empty());
      EXPECT_EQ(list.back(), optimizer_step());
      EXPECT_EQ(std::count(list.begin(), list.end(), optimizer_step()), 1);
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].op != Op::allreduce_grads) continue;
        ASSERT_GE(i, 1u);
        size_t j = i - 1;
        if (list[j].op == Op::send_grad) --j;
        EXPECT_TRUE((list[j].op == Op::backward || list[j].op == Op::backward_weight) && list[j].chunk == list[i].chunk)
            << "allreduce at " << i << " follows " << to_string(list[j]);
      }
    }
  }
}

// ---- bubbles: the papers' closed forms -----------------------------------------------------------

TEST(Bubble, GPipeAndOneFOneBMatchTheClosedForm) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    for (int p : kPipelineSizes) {
      for (int m : kMicroBatches) {
        const ScheduleShape s{kind, p, 1, m};
        SCOPED_TRACE(describe(s));
        const SimResult r = simulate(s, generate_all(s), Costs{});
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (m + p - 1), kTol);
        EXPECT_NEAR(r.makespan, 3.0 * (m + p - 1), kTol);  // F + B + W = 3 per micro-batch and per ramp step
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_NEAR(r.busy[rank], 3.0 * m, kTol);
          EXPECT_NEAR(r.idle[rank], r.makespan - r.busy[rank], kTol);
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 80);
}

TEST(Bubble, InterleavedMatchesTheClosedForm) {
  int checked = 0;
  for (int p : kPipelineSizes) {
    for (int m : kMicroBatches) {
      for (int v : {2, 3}) {
        const ScheduleShape s{ScheduleKind::interleaved, p, v, m};
        if (!valid(s)) continue;
        SCOPED_TRACE(describe(s));
        const double want = double(p - 1) / (v * m + p - 1);
        // Each chunk holds 1/v of the layers, so it costs 1/v of a whole stage...
        Costs split;
        split.chunk_forward.assign(p * v, 1.0 / v);
        split.chunk_backward_input.assign(p * v, 1.0 / v);
        split.chunk_backward_weight.assign(p * v, 1.0 / v);
        const SimResult r = simulate(s, generate_all(s), split);
        EXPECT_NEAR(r.bubble_fraction, want, kTol);
        EXPECT_NEAR(r.makespan, 3.0 * m + 3.0 * (p - 1) / v, kTol);
        // ...and equal costs only scale time.
        EXPECT_NEAR(simulate(s, generate_all(s), Costs{}).bubble_fraction, want, kTol);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 30);
}

TEST(Bubble, ZbH1IdlesOneThirdOfOneFOneB) {
  int checked = 0;
  for (int p : kPipelineSizes) {
    for (int m : kMicroBatches) {
      if (m < p) continue;
      SCOPED_TRACE(cat("pp=", p, " m=", m));
      const ScheduleShape zb{ScheduleKind::zb_h1, p, 1, m};
      const ScheduleShape ofob{ScheduleKind::one_f_one_b, p, 1, m};
      const double zb_idle = total(simulate(zb, generate_all(zb), Costs{}).idle);
      const double ofob_idle = total(simulate(ofob, generate_all(ofob), Costs{}).idle);
      EXPECT_NEAR(zb_idle, ofob_idle / 3, kTol);
      EXPECT_NEAR(zb_idle, double(p) * (p - 1), kTol);  // (p-1)(F+B-W) on each rank
      ++checked;
    }
  }
  EXPECT_EQ(checked, 29);
}

// The paper's bubble for ZB-H1, (p-1)(F+B-W) per rank, holds for any B as long as a W fits in the
// time of an F (a longer W no longer fits the slots 1F1B leaves it).
TEST(Bubble, ZbH1IdlesFPlusBMinusWPerRank) {
  for (double b : {1.0, 1.5, 2.0}) {
    for (double w : {0.5, 0.8, 1.0}) {
      for (int p : {2, 4, 8}) {
        for (int m : {p, 2 * p, 16}) {
          SCOPED_TRACE(cat("B=", b, " W=", w, " pp=", p, " m=", m));
          const ScheduleShape s{ScheduleKind::zb_h1, p, 1, m};
          Costs costs;
          costs.backward_input = b;
          costs.backward_weight = w;
          const SimResult r = simulate(s, generate_all(s), costs);
          for (int rank = 0; rank < p; ++rank) EXPECT_NEAR(r.idle[rank], (p - 1) * (1 + b - w), kTol);
        }
      }
    }
  }
}

// ---- memory --------------------------------------------------------------------------------------

TEST(Memory, PeakLiveMicroBatches) {
  for (int p : kPipelineSizes) {
    for (int m : kMicroBatches) {
      SCOPED_TRACE(cat("pp=", p, " m=", m));
      const ScheduleShape gpipe{ScheduleKind::gpipe, p, 1, m};
      const ScheduleShape ofob{ScheduleKind::one_f_one_b, p, 1, m};
      const auto gpipe_peak = simulate(gpipe, generate_all(gpipe), Costs{}).peak_live_micro_batches;
      const auto ofob_peak = simulate(ofob, generate_all(ofob), Costs{}).peak_live_micro_batches;
      for (int rank = 0; rank < p; ++rank) {
        EXPECT_EQ(gpipe_peak[rank], m);
        EXPECT_EQ(ofob_peak[rank], std::min(p - rank, m));
      }
      const ScheduleShape zb{ScheduleKind::zb_h1, p, 1, m};
      if (!valid(zb)) continue;
      EXPECT_EQ(simulate(zb, generate_all(zb), Costs{}).peak_live_micro_batches, ofob_peak);
      // ZB-H1 holds a micro-batch's weight-gradient inputs until its W: pp of them on every rank,
      // which is 1F1B's peak (on rank 0).
      const auto lists = generate_all(zb);
      for (int rank = 0; rank < p; ++rank) {
        int live = 0, peak = 0;
        for (const Action& a : lists[rank]) {
          live += (a.op == Op::forward) - (a.op == Op::backward_weight);
          peak = std::max(peak, live);
        }
        EXPECT_EQ(peak, p) << "rank " << rank;
      }
    }
  }
}

// ---- times: small cases worked by hand -----------------------------------------------------------

TEST(Simulator, RecvWaitsForTheLink) {
  // gpipe, 2 ranks, 1 micro-batch, comm 0.5: F on rank 0 [0,1), arrives 1.5, F on rank 1 [1.5,2.5),
  // B on rank 1 [2.5,4.5), gradient arrives 5, B on rank 0 [5,7).
  const ScheduleShape s{ScheduleKind::gpipe, 2, 1, 1};
  Costs costs;
  costs.comm = 0.5;
  const SimResult r = simulate(s, generate_all(s), costs);
  EXPECT_NEAR(r.makespan, 7, kTol);
  ASSERT_EQ(r.timeline[1].size(), 2u);
  EXPECT_NEAR(r.timeline[1][0].start, 1.5, kTol);
  EXPECT_NEAR(r.timeline[0][1].start, 5, kTol);
  EXPECT_NEAR(r.bubble_fraction, (4.0 + 4.0) / 14, kTol);
}

TEST(Simulator, PerChunkCostsOverrideTheScalars) {
  // gpipe, 2 ranks, 2 micro-batches, chunk 1 forwards in 2: rank 0 F [0,2), rank 1 F [1,5),
  // rank 1 B (2 each) [5,9), rank 0 B [7,11).
  const ScheduleShape s{ScheduleKind::gpipe, 2, 1, 2};
  Costs costs;
  costs.forward = 100;  // overridden
  costs.chunk_forward = {1, 2};
  const SimResult r = simulate(s, generate_all(s), costs);
  EXPECT_NEAR(r.makespan, 11, kTol);
  EXPECT_NEAR(r.busy[0], 6, kTol);
  EXPECT_NEAR(r.busy[1], 8, kTol);
  EXPECT_NEAR(r.bubble_fraction, 8.0 / 22, kTol);
  costs.chunk_forward = {1, 2, 3};
  expect_error<Error>([&] { simulate(s, generate_all(s), costs); }, {"Costs.chunk_forward", "3 entries", "= 2"});
}

// ---- broken lists ---------------------------------------------------------------------------------

TEST(SimulatorRejects, TwoRanksThatBothReceiveFirst) {
  const ScheduleShape s{ScheduleKind::gpipe, 2, 1, 1};
  const std::vector<std::vector<Action>> lists = {
      {recv_grad(0, 0), forward(0, 0), send_activation(0, 0), backward(0, 0), allreduce_grads(0), optimizer_step()},
      {recv_activation(1, 0), forward(1, 0), backward(1, 0), send_grad(1, 0), allreduce_grads(1), optimizer_step()},
  };
  expect_rejected(s, lists,
                  {"deadlock",
                   "rank 0, action 0 recv_grad(chunk 0, mb 0) waits for send_grad(chunk 1, mb 0) from rank 1, which "
                   "sends it at its action 3 but is blocked at action 0 recv_activation(chunk 1, mb 0)",
                   "rank 1, action 0 recv_activation(chunk 1, mb 0) waits for send_activation(chunk 0, mb 0)"});
}

TEST(SimulatorRejects, RecvWhoseSendNeverComes) {
  const ScheduleShape s{ScheduleKind::gpipe, 2, 1, 1};
  const std::vector<std::vector<Action>> lists = {
      {forward(0, 0), recv_grad(0, 0), backward(0, 0), allreduce_grads(0), optimizer_step()},
      {recv_activation(1, 0), forward(1, 0), backward(1, 0), send_grad(1, 0), allreduce_grads(1), optimizer_step()},
  };
  expect_rejected(s, lists,
                  {"deadlock", "send_activation(chunk 0, mb 0) from rank 0, which never sends it",
                   "what ran before the deadlock", "rank 0 | F0"});
}

TEST(SimulatorRejects, ForwardWithoutItsRecvActivation) {
  const ScheduleShape s{ScheduleKind::one_f_one_b, 2, 1, 2};
  auto lists = generate_all(s);
  lists[1].erase(std::find(lists[1].begin(), lists[1].end(), recv_activation(1, 0)));
  expect_rejected(s, lists,
                  {"rank 1, action 0 forward(chunk 1, mb 0)", "before it arrives",
                   "no recv_activation(chunk 1, mb 0) before it"});
}

TEST(SimulatorRejects, BackwardWithoutItsRecvGrad) {
  const ScheduleShape s{ScheduleKind::zb_h1, 2, 1, 2};
  auto lists = generate_all(s);
  lists[0].erase(std::find(lists[0].begin(), lists[0].end(), recv_grad(0, 1)));
  expect_rejected(s, lists, {"rank 0", "backward_input(chunk 0, mb 1)", "no recv_grad(chunk 0, mb 1) before it"});
}

TEST(SimulatorRejects, MicroBatchWithoutItsBackward) {
  const ScheduleShape s{ScheduleKind::gpipe, 1, 1, 2};
  expect_rejected(s, {{forward(0, 0), forward(0, 1), backward(0, 0)}},
                  {"micro-batch 1 of chunk 0 (rank 0) is unfinished", "never runs backward"});
  // With the all-reduce in place, it is the all-reduce that comes too early.
  expect_rejected(s, {{forward(0, 0), forward(0, 1), backward(0, 0), allreduce_grads(0), optimizer_step()}},
                  {"rank 0, action 3 allreduce_grads(chunk 0)", "before the chunk's last weight gradient",
                   "micro-batch 1"});
  const ScheduleShape zb{ScheduleKind::zb_h1, 1, 1, 1};
  expect_rejected(zb, {{forward(0, 0), backward_input(0, 0), optimizer_step()}},
                  {"optimizer_step", "before allreduce_grads(chunk 0)"});
}

TEST(SimulatorRejects, DuplicatedForward) {
  const ScheduleShape s{ScheduleKind::one_f_one_b, 2, 1, 2};
  auto lists = generate_all(s);
  auto it = std::find(lists[0].begin(), lists[0].end(), forward(0, 1));
  lists[0].insert(it + 1, forward(0, 1));
  expect_rejected(s, lists, {"rank 0", "forward(chunk 0, mb 1)", "micro-batch 1 of chunk 0 is forwarded twice"});
}

TEST(SimulatorRejects, MisplacedOptimizerStep) {
  const ScheduleShape s{ScheduleKind::one_f_one_b, 1, 1, 1};
  const std::vector<Action> good = {forward(0, 0), backward(0, 0), allreduce_grads(0), optimizer_step()};
  EXPECT_NO_THROW(simulate(s, {good}, Costs{}));
  auto twice = good;
  twice.push_back(optimizer_step());
  expect_rejected(s, {twice}, {"action 4 optimizer_step", "duplicate optimizer_step"});
  auto missing = good;
  missing.pop_back();
  expect_rejected(s, {missing}, {"rank 0", "without optimizer_step"});
  auto early = good;
  std::swap(early[2], early[3]);
  expect_rejected(s, {early}, {"optimizer_step", "before allreduce_grads(chunk 0)"});
}

TEST(SimulatorRejects, AllReduceBeforeTheLastWeightGradient) {
  const ScheduleShape s{ScheduleKind::zb_h1, 1, 1, 2};
  auto list = generate_schedule(s, 0);
  const auto it = std::find(list.begin(), list.end(), allreduce_grads(0));
  std::rotate(it - 1, it, it + 1);  // swap with the W before it
  expect_rejected(s, {list}, {"allreduce_grads(chunk 0)", "before the chunk's last weight gradient", "micro-batch 1"});
}

TEST(SimulatorRejects, ActionsOnTheWrongRankOrOutOfRange) {
  const ScheduleShape s{ScheduleKind::gpipe, 2, 1, 1};
  auto lists = generate_all(s);
  lists[0].insert(lists[0].begin(), forward(1, 0));
  expect_rejected(s, lists, {"rank 0, action 0 forward(chunk 1, mb 0)", "lives on rank 1"});
  lists = generate_all(s);
  lists[0][0] = forward(0, 5);
  expect_rejected(s, lists, {"micro-batch is outside [0, train.micro_batches = 1)"});
  const ScheduleShape one{ScheduleKind::gpipe, 1, 1, 1};
  expect_rejected(one, {{forward(0, 0), send_activation(0, 0)}}, {"send_activation(chunk 0, mb 0)", "last chunk"});
}

// ---- the grid ------------------------------------------------------------------------------------

// A weight shared by chunk 0 and the last chunk (GPT's tied embedding) is reduced over their two
// ranks by reduce_tied_grads, after their all-reduces and before their optimizer steps.
TEST(TiedWeights, EveryShapeOfTheTableAddsTheReductionOnTheTwoEndRanks) {
  for (ScheduleShape s : table()) {
    s.tied = true;
    auto lists = generate_all(s);
    EXPECT_NO_THROW(simulate(s, lists, Costs{})) << describe(s);
    for (int r = 0; r < s.pp; ++r) {
      const auto& l = lists[static_cast<size_t>(r)];
      const long n = std::count_if(l.begin(), l.end(), [](const Action& a) { return a.op == Op::reduce_tied_grads; });
      const bool end_rank = s.pp > 1 && (r == 0 || r == s.pp - 1);
      EXPECT_EQ(n, end_rank ? 1 : 0) << describe(s) << " rank " << r;
      if (end_rank) {
        EXPECT_EQ(l[l.size() - 2].op, Op::reduce_tied_grads) << describe(s);
        EXPECT_EQ(l[l.size() - 2].chunk, r == 0 ? 0 : num_chunks(s) - 1) << describe(s);
      }
    }
  }
}

TEST(TiedWeights, AnOptimizerStepBeforeTheReductionIsRejectedByName) {
  const ScheduleShape s{ScheduleKind::one_f_one_b, 3, 1, 4, true};
  auto drop = [](std::vector<Action>& l) {
    l.erase(std::find_if(l.begin(), l.end(), [](const Action& a) { return a.op == Op::reduce_tied_grads; }));
  };
  auto lists = generate_all(s);
  drop(lists[2]);
  expect_error<ScheduleError>([&] { simulate(s, lists, Costs{}); },
                              {"rank 2", "optimizer_step", "runs before reduce_tied_grads(chunk 2)"});
  lists = generate_all(s);
  drop(lists[0]);
  expect_error<ScheduleError>([&] { simulate(s, lists, Costs{}); },
                              {"rank 0", "optimizer_step", "runs before reduce_tied_grads(chunk 0)"});
  // Without the tied flag the action has no place in a list.
  ScheduleShape untied = s;
  untied.tied = false;
  lists = generate_all(s);
  expect_error<ScheduleError>([&] { simulate(untied, lists, Costs{}); }, {"shares no weight"});
}

TEST(RenderGrid, OneFOneBOnTwoRanksWorkedByHand) {
  // Rank 0: F0 [0,1), F1 [1,2), B0 [4,6), B1 [7,9). Rank 1: F0 [1,2), B0 [2,4), F1 [4,5), B1 [5,7).
  const ScheduleShape s{ScheduleKind::one_f_one_b, 2, 1, 2};
  const std::string grid = render_grid(s, simulate(s, generate_all(s), Costs{}));
  EXPECT_EQ(grid,
            "rank 0 | F0 F1 .  .  B0 B0 .  B1 B1\n"
            "rank 1 | .  F0 B0 B0 F1 B1 B1 .  .\n"
            "(a column is 1 time unit; F forward, B backward or backward_input, W backward_weight; '.' idle)\n");
}

TEST(RenderGrid, ShowsChunksAndWeightGradients) {
  const ScheduleShape inter{ScheduleKind::interleaved, 2, 2, 2};
  const std::string grid = render_grid(inter, simulate(inter, generate_all(inter), Costs{}));
  EXPECT_NE(grid.find("rank 1 | .    F0.1 F1.1 F0.3"), std::string::npos) << grid;
  EXPECT_NE(grid.find("F1.3"), std::string::npos) << grid;
  const ScheduleShape zb{ScheduleKind::zb_h1, 2, 1, 2};
  const std::string zb_grid = render_grid(zb, simulate(zb, generate_all(zb), Costs{}));
  EXPECT_NE(zb_grid.find("rank 1 | .  F0 B0 F1 B1 W0 W1"), std::string::npos) << zb_grid;
}

// plan_schedule (what the planner's search keeps per schedule shape): every rank's list is generate_schedule's and every
// chunk's slots are plan_slots' of its rank's list, tied or not (the memory plan reads these instead of its own).
TEST(SlotPlan, PlannedScheduleIsEveryRanksListAndSlots) {
  for (ScheduleKind kind : kAllKinds)
    for (int pp : {2, 4})
      for (int m : {4, 8})
        for (bool tied : {false, true}) {
          ScheduleShape s{kind, pp, kind == ScheduleKind::interleaved ? 2 : 1, m};
          s.tied = tied;
          const PlannedSchedule planned = plan_schedule(s);
          ASSERT_EQ(planned.lists.size(), size_t(pp));
          ASSERT_EQ(planned.slots.size(), size_t(num_chunks(s)));
          for (int r = 0; r < pp; ++r) {
            EXPECT_EQ(planned.lists[size_t(r)], generate_schedule(s, r));
            for (auto& [c, n] : plan_slots(generate_schedule(s, r), m).slots) {
              EXPECT_EQ(chunk_rank(s, c), r);
              EXPECT_GT(n, 0);
              EXPECT_EQ(planned.slots[size_t(c)], n) << schedule_kind_name(kind) << " pp " << pp << " m " << m << " chunk " << c;
            }
          }
        }
}

// Activation slots (parallel/slot_plan.hpp): a chunk needs as many as micro-batches it holds at once,
// which is the simulator's live count; no two micro-batches alive at once share one.
TEST(SlotPlan, SlotsAreTheLiveMicroBatchesAndNeverShared) {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                            ScheduleKind::zb_h1})
    for (int pp : {2, 4})
      for (int m : {4, 8}) {
        ScheduleShape s{kind, pp, kind == ScheduleKind::interleaved ? 2 : 1, m};
        auto lists = generate_all(s);
        SimResult sim = simulate(s, lists, Costs{});
        for (int r = 0; r < pp; ++r) {
          SlotPlan plan = plan_slots(lists[static_cast<size_t>(r)], m);
          int total = 0;
          for (auto& [c, n] : plan.slots) {
            total += n;
            // Replay: a slot is busy from the micro-batch's first action to its last compute action.
            std::map<int, int> holder;  // slot -> micro-batch
            for (auto& a : lists[static_cast<size_t>(r)]) {
              if (a.chunk != c || a.micro_batch < 0) continue;
              const int slot = plan.slot_of[c][static_cast<size_t>(a.micro_batch)];
              ASSERT_GE(slot, 0);
              ASSERT_LT(slot, n);
              if (a.op == Op::recv_activation || a.op == Op::forward) {
                auto it = holder.find(slot);
                ASSERT_TRUE(it == holder.end() || it->second == a.micro_batch)
                    << schedule_kind_name(kind) << " pp " << pp << " m " << m << " rank " << r << ": slot " << slot
                    << " of chunk " << c << " given to mb " << a.micro_batch << " while mb " << it->second << " holds it";
                holder[slot] = a.micro_batch;
              }
              const bool done = a.op == Op::backward_weight || (a.op == Op::backward && kind != ScheduleKind::zb_h1);
              if (done) holder.erase(slot);
            }
          }
          if (kind == ScheduleKind::gpipe) EXPECT_EQ(total, m);
          if (kind == ScheduleKind::one_f_one_b) EXPECT_EQ(total, std::min(m, pp - r)) << "pp " << pp << " rank " << r;
          // Interleaved: each chunk has its own pool, so the sum of the chunks' peaks may exceed the
          // rank's peak; ZB-H1: a micro-batch holds its slot until its W, the simulator counts to B.
          const int peak = sim.peak_live_micro_batches[static_cast<size_t>(r)];
          if (kind == ScheduleKind::interleaved || kind == ScheduleKind::zb_h1) {
            EXPECT_GE(total, peak);
            EXPECT_LE(total, m * s.v);
          } else {
            EXPECT_EQ(total, peak) << schedule_kind_name(kind) << " pp " << pp << " m " << m << " rank " << r;
          }
        }
      }
}

}  // namespace
}  // namespace relay
