#include "plan/collectives.hpp"

#include <algorithm>
#include <cmath>

namespace relay {

GroupPath group_path(const Cluster& c, int size, int stride) {
  GroupPath g;
  g.size = size;
  const int node = c.devices_per_node;
  g.intra_busbw = c.intra_node.busbw();
  g.inter_busbw = c.inter_node.busbw();
  if (size <= 1) return g;
  if (int64_t(size) * stride <= node) {
    g.busbw = c.intra_node.busbw();
    g.reduce_bw = c.intra_node.reduce_bandwidth;
    g.latency = c.intra_node.latency;
    g.members_per_node = size;
    return g;
  }
  g.crosses_nodes = true;
  g.members_per_node = std::max(1, std::min(size, node / std::max(1, stride)));
  // A hierarchical ring: the inter-node share of the bytes leaves through every member's adapter; the
  // NVLink part is never the slower one on the presets, but is kept as a bound.
  g.busbw = std::min(c.intra_node.busbw(), c.inter_node.busbw() * g.members_per_node);
  g.latency = c.inter_node.latency;
  g.reduce_bw = c.inter_node.reduce_bandwidth;
  return g;
}

double all_reduce_s(const GroupPath& g, double bytes) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  // Ring: 2 (n - 1) steps, each rank sending 2 (n - 1) / n of the buffer.
  const double ring = 2.0 * (n - 1) * g.latency + 2.0 * (n - 1) / n * bytes / g.busbw + g.reduce_s(double(n - 1) / n * bytes);
  // Double binary tree (NCCL >= 2.4): 2 log2 n steps, the whole buffer up and down at full bandwidth.
  const double tree = 2.0 * std::ceil(std::log2(double(n))) * g.latency + 2.0 * bytes / g.busbw + g.reduce_s(bytes);
  return std::min(ring, tree);
}

double all_gather_s(const GroupPath& g, double bytes) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  return (n - 1) * g.latency + double(n - 1) / n * bytes / g.busbw;
}

double reduce_scatter_s(const GroupPath& g, double bytes) {
  return all_gather_s(g, bytes) + (g.size > 1 ? g.reduce_s(double(g.size - 1) / g.size * bytes) : 0);
}

double all_to_all_s(const GroupPath& g, double bytes) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  const int q = g.crosses_nodes ? g.members_per_node : n;
  const double intra = double(q - 1) / n * bytes / g.intra_busbw;
  const double inter = g.crosses_nodes ? double(n - q) / n * bytes / g.inter_busbw : 0;
  return (n - 1) * g.latency + std::max(intra, inter);
}

double send_s(const Cluster& c, int stride, double bytes) {
  const Link& l = stride >= c.devices_per_node ? c.inter_node : c.intra_node;
  return l.latency + bytes / l.busbw();
}

}  // namespace relay
