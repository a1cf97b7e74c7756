// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it kills or preempts a job) only set a
// flag; at the next step boundary all ranks agree, write a checkpoint and exit with kExitResumable.
//
// The signals are taken by one thread of their own (sigwait), never by a thread that computes or
// communicates: catch_stop_signals() blocks them in the calling thread before MPI_Init, so every
// thread made afterwards (MPI's, the prefetcher, the checkpoint writer) inherits the block. No
// computing thread is interrupted mid-kernel and no library call sees EINTR because of a stop.
// A handler that only sets the flag stays installed for a thread that unblocks them anyway.
#pragma once

#include "core/exit_codes.hpp"  // kExitResumable

namespace relay {

// Call first, before any other thread exists (before MPI_Init).
void catch_stop_signals();
bool stop_requested();
int stop_signal();  // the signal that asked, 0 if none

}  // namespace relay
