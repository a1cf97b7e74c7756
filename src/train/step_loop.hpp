// The step loop of a training run (train/trainer.cpp's session starts and ends it): one optimizer step after another,
// each followed by what is due at that step: the logged window (rank 0's metrics.jsonl record; every rank's memory
// and compute times reduced), the evaluation, the memory report after the first step, a checkpoint, and a stop
// on a signal or train.time_limit. Every rank runs the same steps in lockstep (the loss, the stop flag and the
// gradient norm are reduced every step).
#pragma once
#include <chrono>
#include <cstdint>

#include "parallel/executor.hpp"
#include "train/checkpoint_writer.hpp"
#include "train/metrics.hpp"
#include "train/run_state.hpp"
#include "train/stragglers.hpp"

namespace relay {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What the session hands the loop.
struct LoopSetup {
  CheckpointWriter& writer;
  MetricsLog* log;           // rank 0's metrics.jsonl; null on the other ranks
  StragglerMonitor& stragglers;
  int64_t restarts = 0;      // in-job restarts before this one (logged with every record)
  double t_start = 0;        // now_s() at the session's start: elapsed time and train.time_limit count from it
};

// How the loop ended.
struct LoopOutcome {
  int64_t last_step = 0;     // the last step run
  bool stopped = false;      // a stop request honoured with a checkpoint before train.steps
  int stop_signal = 0;       // the signal that asked on any rank (agreed by all), 0: train.time_limit
  StepStats totals;          // this rank's compute, waiting and step time summed over the steps run
  // For the plan comparison: the wall time of the steps after the first, and the tensors' bytes after the first step.
  double steps_after_first_s = 0, memory_after_first = 0;
};

// Runs steps r.start_step + 1 .. train.steps, or to an agreed stop (then the stop step's checkpoint is written).
LoopOutcome run_steps(Run& r, LoopSetup& setup);

// moe.expert_bias: every block of this rank takes its layer's row of r.expert_bias (after a resume, and after each
// step's update).
void push_expert_bias(Run& r);

}  // namespace relay
