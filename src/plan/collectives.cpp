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
  g.intra_all_to_all = c.intra_node.measured.all_to_all > 0 ? c.intra_node.measured.all_to_all : g.intra_busbw;
  g.inter_all_to_all = c.inter_node.measured.all_to_all > 0 ? c.inter_node.measured.all_to_all : g.inter_busbw;
  if (size <= 1) return g;
  if (int64_t(size) * stride <= node) {
    g.busbw = c.intra_node.busbw();
    g.reduce_bw = c.intra_node.reduce_bandwidth;
    g.latency = c.intra_node.latency;
    g.measured = c.intra_node.measured;
    g.compute_share = c.intra_node.overlap_compute_share;
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
  g.compute_share = c.inter_node.overlap_compute_share;
  auto across = [&](double inter) { return inter > 0 ? std::min(c.intra_node.busbw(), inter * g.members_per_node) : 0; };
  const Link::Measured& m = c.inter_node.measured;
  g.measured = {across(m.all_reduce), across(m.all_gather), across(m.reduce_scatter), across(m.all_to_all)};
  return g;
}

double all_reduce_s(const GroupPath& g, double bytes) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  if (g.measured.all_reduce > 0) return 2.0 * (n - 1) * g.latency + 2.0 * (n - 1) / n * bytes / g.measured.all_reduce;
  // Ring: 2 (n - 1) steps, each rank sending 2 (n - 1) / n of the buffer.
  const double ring = 2.0 * (n - 1) * g.latency + 2.0 * (n - 1) / n * bytes / g.busbw + g.reduce_s(double(n - 1) / n * bytes);
  // Double binary tree (NCCL >= 2.4): 2 log2 n steps, the whole buffer up and down at full bandwidth.
  const double tree = 2.0 * std::ceil(std::log2(double(n))) * g.latency + 2.0 * bytes / g.busbw + g.reduce_s(bytes);
  return std::min(ring, tree);
}

namespace {

// A ring of n - 1 steps moving (n - 1)/n of the buffer at busbw.
double ring_s(const GroupPath& g, double bytes, double busbw) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  return (n - 1) * g.latency + double(n - 1) / n * bytes / busbw;
}

}  // namespace

double all_gather_s(const GroupPath& g, double bytes) {
  return ring_s(g, bytes, g.measured.all_gather > 0 ? g.measured.all_gather : g.busbw);
}

double reduce_scatter_s(const GroupPath& g, double bytes) {
  if (g.measured.reduce_scatter > 0) return ring_s(g, bytes, g.measured.reduce_scatter);
  return ring_s(g, bytes, g.busbw) + (g.size > 1 && bytes > 0 ? g.reduce_s(double(g.size - 1) / g.size * bytes) : 0);
}

double all_to_all_s(const GroupPath& g, double bytes) {
  const int n = g.size;
  if (n <= 1 || bytes <= 0) return 0;
  const int q = g.crosses_nodes ? g.members_per_node : n;
  const double intra = double(q - 1) / n * bytes / g.intra_all_to_all;
  const double inter = g.crosses_nodes ? double(n - q) / n * bytes / g.inter_all_to_all : 0;
  return (n - 1) * g.latency + std::max(intra, inter);
}

double send_s(const Cluster& c, int stride, double bytes) {
  const Link& l = stride >= c.devices_per_node ? c.inter_node : c.intra_node;
  return l.latency + bytes / l.busbw();
}

}  // namespace relay
