// The whole model as every rank sees it: its blocks, the cut into pipeline chunks, and the global list
// of parameters (the checkpoint manifest) with the pipeline ranks that hold each one. A tied weight
// (GPT's token embedding, used by the embedding and the head) is one parameter; when its two blocks
// sit on two pipeline ranks, both hold a copy. Pure: no MPI, no allocation.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/model_spec.hpp"
#include "parallel/partition.hpp"
#include "parallel/schedule.hpp"

namespace relay {

struct ParamEntry {
  std::string name;
  Shape shape;     // the whole tensor
  TpSplit split;   // how tensor parallelism splits it
  std::vector<int> pp_ranks;  // ranks holding a copy, ascending; the first is the owner (checkpoints)
  int ep_owner = -1;          // an expert's weight under parallel.ep: the ep rank holding it (-1: every ep rank)
};

// Where one parameter lives and how its gradient is treated, seen from one rank: the one rule the
// gradient buckets, the tied reduction, the norm and the checks all use.
struct ParamPlacement {
  bool tied = false;           // held by more than one pipeline rank: the copies' gradients are summed each step
  bool owner = true;           // this pipeline rank is the first that holds it (its copy is the one checkpointed)
  bool tp_replicated = false;  // whole on every tp rank (not split): the tp ranks' gradients are equal
  bool counts_in_norm = true;  // counted once in the gradient norm: the owner's copy, on tp rank 0 unless split
  bool expert = false;         // an expert's weight under parallel.ep: reduced over the ranks holding that expert
};

struct ModelLayout {
  ModelSpec model;
  int pp = 1, v = 1;
  int ep = 1;                      // parallel.ep: each MoE layer's experts split over ep ranks
  std::vector<ChunkRange> chunks;  // pp * v contiguous block ranges

  const std::vector<BlockSpec>& blocks() const { return model.blocks; }
  int num_chunks() const { return static_cast<int>(chunks.size()); }
  int chunk_of_block(int block) const;
  int pp_rank_of_chunk(int c) const { return c % pp; }
  // Every parameter of the model once, in block order.
  std::vector<ParamEntry> params() const;
  // Parameters held by more than one pipeline rank (a tied embedding with pp > 1).
  std::vector<ParamEntry> shared_params() const;
  // The placement of parameter `name` on pipeline rank pp_rank, tp rank tp_rank of tp; of every parameter at once (one
  // pass over the model: the memory plan and setup ask for each of thousands of parameters).
  ParamPlacement placement(const std::string& name, int pp_rank, int tp, int tp_rank) const;
  std::map<std::string, ParamPlacement> placements(int pp_rank, int tp, int tp_rank) const;
  int64_t param_count() const;
};

// input_dim: the MLP's feature count (ignored for GPT).
ModelLayout make_layout(const Config& cfg, int64_t input_dim, const std::vector<double>& measured_costs = {});

// The schedule's (kind, pp, v, m) from [parallel] and train.micro_batches, validated (Error naming keys).
ScheduleShape schedule_shape(const Config& cfg);
// Samples per micro-batch: train.batch_size / (parallel.dp x train.micro_batches); an Error naming the
// keys when it does not divide.
int64_t micro_batch_rows(const Config& cfg);

}  // namespace relay
