// Tensor parallelism (Megatron-LM: Shoeybi et al., arXiv:1909.08053): how a parameter is split over the
// tp ranks of a stage, and the group's context the blocks use for their collectives.
//
// A split names one dimension of the parameter's torch shape and a number of equal segments along it
// (3 for GPT's fused QKV weight, whose rows are [q; k; v]); tp rank r holds, of every segment, the
// indices [r * n / tp, (r + 1) * n / tp), n the segment's length. Column-parallel weights split dim 0
// (their output features), row-parallel weights dim 1 (their input features), vocabulary-parallel
// embeddings dim 0 (the vocabulary, which need not divide: shards may differ by one row).
// Checkpoints hold whole tensors; these functions cut a shard out of one and put it back.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor.hpp"

namespace relay {

struct TpSplit {
  int dim = -1;   // -1: replicated on every tp rank
  int parts = 1;  // equal segments along dim, each split over the tp ranks
  bool replicated() const { return dim < 0; }
};

// [begin, end) of tp rank r's share of n indices.
inline int64_t tp_begin(int64_t n, int tp, int r) { return n * r / tp; }
inline int64_t tp_end(int64_t n, int tp, int r) { return n * (r + 1) / tp; }

// The shape tp rank r holds of a tensor of shape `full`.
Shape shard_shape(const Shape& full, TpSplit s, int tp, int r);
// full (host, numel(full)) -> shard (host, numel(shard_shape)) and back.
void extract_shard(const float* full, const Shape& full_shape, TpSplit s, int tp, int r, float* shard);
void insert_shard(const float* shard, const Shape& full_shape, TpSplit s, int tp, int r, float* full);

// A stage's tensor-parallel group as a block sees it. comm is null when size == 1.
struct TensorParallel {
  Communicator* comm = nullptr;
  int size = 1, rank = 0;
  bool on() const { return size > 1; }
  // In-place sum over the group (blocking, watched); nothing when size == 1. `what` names it for the
  // watchdog ("the attention output all-reduce").
  void allreduce_sum(Tensor& t, const char* what) const;
  void allreduce_max(Tensor& t, const char* what) const;
};

}  // namespace relay
