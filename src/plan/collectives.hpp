// Collective and point-to-point times by the alpha-beta model (Hockney; the ring and double-binary-tree
// forms NCCL implements, Thakur et al. 2005 "Optimization of Collective Communication Operations in
// MPICH"), over the link a group crosses. Relay's rank order (Megatron-LM's, parallel/process_grid.hpp):
// world rank = ((pp x dp + dp_rank) x cp + cp_rank) x tp + tp_rank, so tp is innermost (stride 1), cp has
// stride tp, dp stride tp x cp and pp stride tp x cp x dp.
#pragma once
#include "plan/cluster.hpp"

namespace relay {

// The path a group of `size` ranks, `stride` ranks apart, takes: inside one node when it fits there,
// else across nodes, where each node's `members` of the group drive their own adapter (one per GPU on
// the presets), so a ring's inter-node bytes spread over them.
struct GroupPath {
  int size = 1;
  bool crosses_nodes = false;
  int members_per_node = 1;
  double busbw = 0, latency = 0;  // bytes/s per rank of a large ring collective; seconds per step
};
GroupPath group_path(const Cluster& c, int size, int stride);

// Seconds for a buffer of `bytes` (the whole buffer: each rank's input for all-reduce, the gathered
// result for all-gather and the reduce-scatter's input): the faster of ring and tree for all-reduce,
// rings otherwise. 0 for a group of one.
double all_reduce_s(const GroupPath& g, double bytes);
double all_gather_s(const GroupPath& g, double bytes);
double reduce_scatter_s(const GroupPath& g, double bytes);
// One message of `bytes` between two ranks `stride` apart (a pipeline send).
double send_s(const Cluster& c, int stride, double bytes);

}  // namespace relay
