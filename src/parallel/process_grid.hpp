// The dp x tp x pp process grid, built once from MPI_COMM_WORLD and passed by reference (no singleton).
// Rank order (Megatron-LM's): world rank = (pp_rank * dp + dp_rank) * tp + tp_rank, so a tensor-parallel
// group is tp adjacent ranks (one node), then data-parallel replicas, then pipeline stages.
#pragma once
#include <mpi.h>

#include <string>

namespace relay {

struct ProcessGrid {
  int world_rank = 0, world_size = 1;
  int dp = 1, pp = 1, tp = 1;
  int dp_rank = 0, pp_rank = 0, tp_rank = 0;
  int local_rank = 0, local_size = 1;  // among the ranks on this node (MPI_COMM_TYPE_SHARED)
  std::string host;
  MPI_Comm dp_comm = MPI_COMM_NULL;  // same (pp_rank, tp_rank); its rank == dp_rank
  MPI_Comm pp_comm = MPI_COMM_NULL;  // same (dp_rank, tp_rank); its rank == pp_rank
  MPI_Comm tp_comm = MPI_COMM_NULL;  // same (pp_rank, dp_rank); its rank == tp_rank

  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
  int prev() const { return pp_rank - 1; }  // pp_comm ranks; -1 on the first stage
  int next() const { return is_last_stage() ? -1 : pp_rank + 1; }
  int world_rank_of(int pp_r, int dp_r, int tp_r = 0) const { return (pp_r * dp + dp_r) * tp + tp_r; }
};

// A world rank's (dp, tp, pp) coordinate in the order above; usable before the grid exists.
struct GridCoord {
  int dp_rank, tp_rank, pp_rank;
};
inline GridCoord grid_coord(int world_rank, int dp, int tp) {
  return {(world_rank / tp) % dp, world_rank % tp, world_rank / (tp * dp)};
}

// "rank 2 (stage 1, replica 0)", with ", tp 1" when tp > 1: how messages, traces and the placement
// table name a world rank; usable before the grid exists.
std::string rank_label(int world_rank, int dp, int tp = 1);

// Node-local rank and size (for threads per rank and GPU choice); usable before the grid exists.
void local_rank_and_size(int& local_rank, int& local_size);

// Splits MPI_COMM_WORLD. Throws relay::Error (the same on every rank) when world size != dp * tp * pp.
ProcessGrid make_process_grid(int dp, int pp, int tp = 1);
void free_process_grid(ProcessGrid& g);

}  // namespace relay
