// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it kills or preempts a job) only set a
// flag; at the next step boundary all ranks agree, write a checkpoint and exit with kExitResumable.
#pragma once

#include "core/exit_codes.hpp"  // kExitResumable

namespace relay {

void install_stop_signal_handlers();
bool stop_requested();
int stop_signal();  // the signal that asked, 0 if none

}  // namespace relay
