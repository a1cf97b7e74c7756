// The dp x cp x tp x pp process grid, built once from MPI_COMM_WORLD and passed by reference (no singleton).
// Rank order (Megatron-LM's, tp innermost): world rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank,
// so a tensor-parallel group is tp adjacent ranks (one node), then the context-parallel ranks that share a
// sequence, then data-parallel replicas, then pipeline stages. The dp x cp ranks of a (pp, tp) coordinate hold the
// same parameters (replicas) and sum their gradients; data is split over dp only (cp ranks read the same sequences
// and keep their own chunks of them).
#pragma once
#include <mpi.h>

#include <string>

namespace relay {

struct ProcessGrid {
  int world_rank = 0, world_size = 1;
  int dp = 1, pp = 1, tp = 1, cp = 1;
  int dp_rank = 0, pp_rank = 0, tp_rank = 0, cp_rank = 0;
  // Expert parallelism (parallel.ep, MoE): ep consecutive data-parallel ranks hold one MoE layer's experts between
  // them, n_experts / ep each (ep_rank's); the dp / ep ranks with the same ep_rank hold the same experts.
  int ep = 1, ep_rank = 0;
  int local_rank = 0, local_size = 1;  // among the ranks on this node (MPI_COMM_TYPE_SHARED)
  std::string host;
  MPI_Comm dp_comm = MPI_COMM_NULL;  // the replicas: same (pp_rank, tp_rank); its rank == replica_rank()
  MPI_Comm pp_comm = MPI_COMM_NULL;  // same (dp_rank, cp_rank, tp_rank); its rank == pp_rank
  MPI_Comm tp_comm = MPI_COMM_NULL;  // same (pp_rank, dp_rank, cp_rank); its rank == tp_rank
  MPI_Comm cp_comm = MPI_COMM_NULL;  // same (pp_rank, dp_rank, tp_rank); its rank == cp_rank
  MPI_Comm ep_comm = MPI_COMM_NULL;  // same (pp_rank, dp_rank / ep, cp_rank, tp_rank); its rank == ep_rank
  // The replicas of this rank's experts: same (pp_rank, ep_rank, tp_rank); its rank == expert_replica_rank()
  MPI_Comm expert_dp_comm = MPI_COMM_NULL;

  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp - 1; }
  int prev() const { return pp_rank - 1; }  // pp_comm ranks; -1 on the first stage
  int next() const { return is_last_stage() ? -1 : pp_rank + 1; }
  // Ranks holding the same parameters (data- and context-parallel), and this rank's index among them.
  int replicas() const { return dp * cp; }
  int replica_rank() const { return dp_rank * cp + cp_rank; }
  // Ranks holding the same experts (ep divides dp), and this rank's index among them.
  int expert_replicas() const { return dp / ep * cp; }
  int expert_replica_rank() const { return dp_rank / ep * cp + cp_rank; }
  int world_rank_of(int pp_r, int dp_r, int tp_r = 0, int cp_r = 0) const {
    return ((pp_r * dp + dp_r) * cp + cp_r) * tp + tp_r;
  }
};

// A world rank's (dp, tp, pp, cp) coordinate in the order above; usable before the grid exists.
struct GridCoord {
  int dp_rank, tp_rank, pp_rank, cp_rank = 0;
};
inline GridCoord grid_coord(int world_rank, int dp, int tp, int cp = 1) {
  return {(world_rank / (tp * cp)) % dp, world_rank % tp, world_rank / (tp * cp * dp), (world_rank / tp) % cp};
}

// "rank 2 (stage 1, replica 0)", with ", cp 1" when cp > 1 and ", tp 1" when tp > 1: how messages, traces and the
// placement table name a world rank; usable before the grid exists.
std::string rank_label(int world_rank, int dp, int tp = 1, int cp = 1);

// Node-local rank and size (for threads per rank and GPU choice); usable before the grid exists.
void local_rank_and_size(int& local_rank, int& local_size);

// Splits MPI_COMM_WORLD. Throws relay::Error (the same on every rank) when world size != dp * cp * tp * pp.
// ep must divide dp (the config checks it).
ProcessGrid make_process_grid(int dp, int pp, int tp = 1, int cp = 1, int ep = 1);
void free_process_grid(ProcessGrid& g);

}  // namespace relay
