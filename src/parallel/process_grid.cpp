#include "parallel/process_grid.hpp"

#include <unistd.h>

#include "comm/mpi_check.hpp"
#include "core/error.hpp"

namespace relay {

void local_rank_and_size(int& local_rank, int& local_size) {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  MPI_CHECK(MPI_Comm_free(&node));
}

ProcessGrid make_process_grid(int dp, int pp, int tp, int cp, int ep) {
  ProcessGrid g;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g.world_size));
  const int n = dp * cp * tp * pp;
  if (g.world_size != n) {
    std::string what = "parallel.dp", values = cat(dp);
    if (cp > 1) what += " x parallel.cp", values += cat(" x ", cp);
    if (tp > 1) what += " x parallel.tp", values += cat(" x ", tp);
    what += " x parallel.pp", values += cat(" x ", pp);
    throw Error(cat("the job has ", g.world_size, " ranks but ", what, " = ", values, " = ", n, " (hint: launch ", n,
                    " ranks, e.g. mpirun -np ", n, ", or change parallel.dp/parallel.cp/parallel.tp/parallel.pp)"));
  }
  g.dp = dp;
  g.pp = pp;
  g.tp = tp;
  g.cp = cp;
  const GridCoord c = grid_coord(g.world_rank, dp, tp, cp);
  g.dp_rank = c.dp_rank;
  g.tp_rank = c.tp_rank;
  g.pp_rank = c.pp_rank;
  g.cp_rank = c.cp_rank;
  g.ep = ep;
  g.ep_rank = g.dp_rank % ep;
  local_rank_and_size(g.local_rank, g.local_size);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  g.host = host;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, g.pp_rank * tp + g.tp_rank, g.replica_rank(), &g.dp_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, (g.dp_rank * cp + g.cp_rank) * tp + g.tp_rank, g.pp_rank, &g.pp_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, (g.pp_rank * dp + g.dp_rank) * cp + g.cp_rank, g.tp_rank, &g.tp_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, (g.pp_rank * dp + g.dp_rank) * tp + g.tp_rank, g.cp_rank, &g.cp_comm));
  if (ep > 1) {
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, ((g.pp_rank * (dp / ep) + g.dp_rank / ep) * cp + g.cp_rank) * tp + g.tp_rank,
                             g.ep_rank, &g.ep_comm));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, (g.pp_rank * ep + g.ep_rank) * tp + g.tp_rank, g.expert_replica_rank(),
                             &g.expert_dp_comm));
  }
  return g;
}

void free_process_grid(ProcessGrid& g) {
  if (g.dp_comm != MPI_COMM_NULL) MPI_Comm_free(&g.dp_comm);
  if (g.pp_comm != MPI_COMM_NULL) MPI_Comm_free(&g.pp_comm);
  if (g.tp_comm != MPI_COMM_NULL) MPI_Comm_free(&g.tp_comm);
  if (g.cp_comm != MPI_COMM_NULL) MPI_Comm_free(&g.cp_comm);
  if (g.ep_comm != MPI_COMM_NULL) MPI_Comm_free(&g.ep_comm);
  if (g.expert_dp_comm != MPI_COMM_NULL) MPI_Comm_free(&g.expert_dp_comm);
}

std::string rank_label(int world_rank, int dp, int tp, int cp) {
  const GridCoord c = grid_coord(world_rank, dp, tp, cp);
  return cat("rank ", world_rank, " (stage ", c.pp_rank, ", replica ", c.dp_rank,
             cp > 1 ? cat(", cp ", c.cp_rank) : std::string(), tp > 1 ? cat(", tp ", c.tp_rank) : std::string(), ")");
}

}  // namespace relay
