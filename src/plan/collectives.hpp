// Collective and point-to-point times by the alpha-beta model (Hockney; the ring and double-binary-tree
// forms NCCL implements, Thakur et al. 2005 "Optimization of Collective Communication Operations in
// MPICH"), over the link a group crosses. Relay's rank order (Megatron-LM's, parallel/process_grid.hpp):
// world rank = ((pp x dp + dp_rank) x cp + cp_rank) x tp + tp_rank, so tp is innermost (stride 1), cp has
// stride tp, dp stride tp x cp and pp stride tp x cp x dp. An expert-parallel group (parallel.ep) is ep consecutive dp
// ranks: stride tp x cp, spanning tp x cp x ep consecutive world ranks.
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
  double intra_busbw = 0, inter_busbw = 0;  // each rank's own links: NVLink, its network adapter (all-to-all)
  double reduce_bw = 0;  // the crossed link's reduce_bandwidth (0: reductions at line rate)
  // The crossed link's measured bus bandwidth of each collective (Link::measured; 0: not measured, the alpha-beta form
  // above prices it), across nodes times the members driving their own adapters as busbw is.
  Link::Measured measured;
  double intra_all_to_all = 0, inter_all_to_all = 0;  // each link's measured all-to-all busbw, else its busbw
  // The crossed link's overlap_compute_share: compute lost per second of the group's collectives hidden behind it.
  double compute_share = 0;
  double reduce_s(double bytes) const { return reduce_bw > 0 ? bytes / reduce_bw : 0; }
};
GroupPath group_path(const Cluster& c, int size, int stride);

// Seconds for a buffer of `bytes` (the whole buffer: each rank's input for all-reduce, the gathered
// result for all-gather and the reduce-scatter's input): the faster of ring and tree for all-reduce,
// rings otherwise; all-reduce and reduce-scatter also sum (n - 1)/n of the buffer (the tree: all of it) at the link's
// reduce_bandwidth where it has one; a collective whose bus bandwidth the link measured (Link::measured) is priced by
// the ring's steps x latency + bus bytes / that bandwidth instead. 0 for a group of one.
double all_reduce_s(const GroupPath& g, double bytes);
double all_gather_s(const GroupPath& g, double bytes);
double reduce_scatter_s(const GroupPath& g, double bytes);
// All-to-all (pairwise exchange, Thakur et al. 2005 section 4.4; NCCL runs it as grouped send/recv): each rank sends
// `bytes` in all, a 1/n share to every rank of the group (balanced routing), itself included. With q of the n ranks
// on the rank's node, (q - 1)/n of the bytes cross NVLink and (n - q)/n the rank's own network adapter, at once:
//   t = (n - 1) alpha + max((q - 1)/n x bytes / busbw_intra, (n - q)/n x bytes / busbw_inter).
double all_to_all_s(const GroupPath& g, double bytes);
// One message of `bytes` between two ranks `stride` apart (a pipeline send).
double send_s(const Cluster& c, int stride, double bytes);

}  // namespace relay
