// The training run on one rank: builds the grid, backend, data, model chunks, buckets, optimizer and
// schedule; resumes from a checkpoint; runs steps; logs, evaluates, checkpoints and stops on signals.
#pragma once
#include "core/config.hpp"

namespace relay {

// Runs `cfg` inside an initialised MPI job. Returns 0 when train.steps are done, or kExitResumable
// after a stop request (signal or train.time_limit) was honoured with a checkpoint. User mistakes
// throw AgreedError (already printed by the rank that saw them) or Error (this rank only).
int run_training(const Config& cfg);

}  // namespace relay
