// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it kills or preempts a job) only set a
// flag; at the next step boundary all ranks agree, write a checkpoint and exit with kExitResumable.
#pragma once

namespace relay {

// "Stopped early, resumable": a checkpoint was written; rerun the same command to continue
// (EX_TEMPFAIL from sysexits.h). Documented in the README and used by jobscripts/.
constexpr int kExitResumable = 75;

void install_stop_signal_handlers();
bool stop_requested();
int stop_signal();  // the signal that asked, 0 if none

}  // namespace relay
