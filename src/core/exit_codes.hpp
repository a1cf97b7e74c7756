// The exit codes of `relay train`, a public interface: jobscripts/ act on them (requeue on 75, restart
// in the allocation on 74 and on a rank killed by a signal, never again on 76). Listed in docs/operations.md
// ("Exit codes of relay train") and in jobscripts/README.md.
#pragma once

namespace relay {

constexpr int kExitError = 1;  // a user mistake or a failure that would repeat (config, data, disk)
// A rank stopped making progress and the progress watchdog ended the job (parallel.timeout): the
// fault is in the machine, not the run, so the job scripts start it again from the newest checkpoint.
constexpr int kExitStalled = 74;
// "Stopped early, resumable": a checkpoint was written; rerun the same command to continue
// (EX_TEMPFAIL from sysexits.h).
constexpr int kExitResumable = 75;
// An in-job restart failed again at the same step with no newer checkpoint: another restart or a
// requeue would only repeat it, so the job scripts stop (NVIDIA's resiliency extension has the same
// "do not restart" code).
constexpr int kExitNoProgress = 76;

}  // namespace relay
