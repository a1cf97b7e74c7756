// What `relay plan --measure` measures on this machine, and how: each block's forward, backward-input and
// backward-weight time at the micro-batch's rows with Relay's own backend (the simulator's per-chunk costs), and,
// under mpirun or srun with --calibrate, the links between the launched ranks (plan/link_calibration.hpp).
// cli/cmd_plan.cpp prints what these return.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "core/config.hpp"
#include "model/block.hpp"
#include "parallel/simulator.hpp"
#include "plan/link_calibration.hpp"
#include "train/model_layout.hpp"

namespace relay {

// Seconds one block takes for a micro-batch (mean of 5 repeats after a warm-up).
struct BlockTimes {
  double forward = 0, backward_input = 0, backward_weight = 0;
};

// One block alone on `be` at `rows` rows (tokens of a micro-batch for a language model), every expert on this
// process and whole sequences (ep = cp = 1).
BlockTimes time_block(Backend& be, const BlockSpec& planned, int64_t rows);

// Every block of the layout timed (blocks, in order) and summed into its chunk's simulator costs.
struct MeasuredCosts {
  std::vector<BlockTimes> blocks;  // (blocks)
  Costs costs;                     // chunk_forward, chunk_backward_input, chunk_backward_weight: (chunks)
};
MeasuredCosts measure_costs(Backend& be, const ModelLayout& layout, int64_t rows);

// `relay plan --measure --calibrate` started by mpirun or srun: every rank measures the links through the communicator
// (within each host, then between hosts' first ranks); then rank 0 alone measures the compute and writes the file while
// the others wait for its exit status (polling, so that they take no core from it) and exit with it.
class LaunchedRanks {
 public:
  // Whether a launcher (mpirun, srun) started this process.
  static bool launched();
  LaunchedRanks();  // MPI_Init_thread
  ~LaunchedRanks();  // MPI_Finalize
  int rank() const { return rank_; }
  // On GPUs (train.device), each rank times its own GPU's collectives through NCCL (parallel.comm = "mpi": MPI).
  LinkCalibration measure(const Config& cfg);
  // Rank 0: tell the others how it ended. The others: wait for that and return it.
  void release(int status);
  int wait_for_rank0();

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace relay
