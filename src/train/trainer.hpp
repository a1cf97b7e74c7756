// The training run on one rank: builds the grid, backend, data, model chunks, buckets, optimizer and
// schedule; resumes from a checkpoint; runs steps; logs, evaluates, checkpoints and stops on signals.
#pragma once
#include "core/config.hpp"
#include "train/run_prediction.hpp"

namespace relay {

// Runs `cfg` inside an initialised MPI job. Returns 0 when train.steps are done, or kExitResumable
// after a stop request (signal or train.time_limit) was honoured with a checkpoint. User mistakes
// throw AgreedError (already printed by the rank that saw them) or Error (this rank only). With a prediction
// (relay train --plan-cluster), rank 0 writes it as metrics.jsonl's first record and compares it with the run.
int run_training(const Config& cfg, const RunPrediction& plan = {});

}  // namespace relay
