// Replays every pipeline rank's action list together, without MPI, with the executor's blocking rules,
// and draws the step x rank grid. Reproduces the bubbles of GPipe (arXiv:1811.06965), 1F1B and
// interleaved 1F1B (arXiv:2104.04473) and ZB-H1 (arXiv:2401.10241); see tests/test_schedule.cpp.
#pragma once
#include <string>
#include <vector>

#include "core/error.hpp"
#include "parallel/schedule.hpp"

namespace relay {

// Time units. Per-chunk vectors (size pp*v) override the scalars when non-empty. comm is the time
// from a send to the moment the matching recv can return.
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1, comm = 0;
  std::vector<double> chunk_forward, chunk_backward_input, chunk_backward_weight;
};

struct TimedAction {
  Action action;
  double start, end;
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy, idle;  // per rank; idle = makespan - busy
  double bubble_fraction = 0;      // sum(idle) / (pp * makespan)
  // Per rank: the most (chunk, mb) pairs forwarded but not yet through backward_input (or backward).
  std::vector<int> peak_live_micro_batches;
  std::vector<std::vector<TimedAction>> timeline;  // per rank, the compute actions with their times
};

// A schedule the simulator rejects; the message names the rank, the action and the reason.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

// Sends never block; a recv blocks until its matching send has run (arrival = send time + comm);
// only compute actions take time. This is the executor's behaviour, so an accepted schedule cannot
// deadlock at run time. Throws ScheduleError on deadlock, on a tensor used before it arrived, on a
// micro-batch unfinished or done twice, on a missing or duplicate optimizer_step, and on an
// allreduce_grads before its chunk's last weight gradient.
SimResult simulate(const ScheduleShape& s, const std::vector<std::vector<Action>>& lists, const Costs& costs);

// One row per rank, one column per time unit (the shortest compute action): F3 forward, B3 backward
// or backward_input, W3 backward_weight of micro-batch 3; with v > 1 the chunk follows, F3.5 is
// micro-batch 3 on chunk 5. An action spans as many columns as it takes time units; '.' is idle.
std::string render_grid(const ScheduleShape& s, const SimResult& r);

// The simulated schedule in the format of a run's trace.json (comm/trace.hpp), to open side by side with one: one
// process per pipeline rank, compute spans on track 0, one time unit = 1 ms. An Error naming `path` when it cannot
// be written.
void write_sim_trace(const std::string& path, const ScheduleShape& shape, const SimResult& sim);

}  // namespace relay
