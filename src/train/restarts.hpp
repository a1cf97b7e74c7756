// In-job restarts: jobscripts/relay-mpirun.sh --restarts N and the batch scripts (RELAY_RESTARTS)
// start a run that lost or stalled a rank again, in the same allocation, from its newest checkpoint,
// and tell it so through RELAY_RESTART_COUNT (1, 2, ...) and RELAY_RESTART_CAUSE. Rank 0 records each
// restart in metrics.jsonl and refuses one that would repeat the last (exit kExitNoProgress).
// After NVIDIA's resiliency extension (in-job restart and its "do not restart" exit code).
#pragma once
#include <cstdint>
#include <string>

namespace relay {

struct RestartInfo {
  int64_t count = 0;  // restarts in this allocation so far; 0 = the first run
  std::string cause;  // what ended the run before, as the job script saw it
};
RestartInfo restart_from_env();  // RELAY_RESTART_COUNT, RELAY_RESTART_CAUSE

struct RestartVerdict {
  int64_t failed_after_step = -1;  // the last step the failed run logged (-1: none)
  std::string no_progress;         // non-empty: why this restart would only repeat the previous one
};
// Rank 0, before metrics.jsonl is cut back to the resume step: the step the failed run reached, and
// whether it got no further than the run before it, from the same checkpoint (resume_step), as told
// by the previous restart's record. The first restart is always allowed.
RestartVerdict judge_restart(const std::string& metrics_path, int64_t resume_step, const RestartInfo& info);

// Test only: RELAY_TEST_KILL_RANK=R RELAY_TEST_KILL_STEP=S make world rank R kill itself (SIGKILL)
// as step S begins, in every run: a fault that repeats at one step. -1 elsewhere.
int64_t test_kill_step(int world_rank);
// With RELAY_TEST_KILL_WHERE=zero3-gather the rank kills itself inside that step's first ZeRO-3 parameter
// all-gather instead (its piece sent, the gather in flight), a rank lost mid-collective.
bool test_kill_in_gather();
// With RELAY_TEST_KILL_WHERE=<site>-stop | <site>-kill the rank raises SIGSTOP (SIGKILL) right after it next starts
// the collective of that site instead (core/test_faults.hpp: bucket, tp, ep).

}  // namespace relay
