#include "train/memory_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "backend/backend.hpp"
#include "core/memory.hpp"
#include "model/chunk.hpp"
#include "model/context_parallel.hpp"
#include "model/expert_parallel.hpp"
#include "model/fp8_linear.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/sharding.hpp"
#include "parallel/slot_plan.hpp"

namespace relay {

namespace {
// f(chunk, block, param, expert) for every parameter of pp rank pp_rank's blocks in chunk and block order (a tied
// parameter once per block that uses it); of a MoE layer's experts under ep, ep rank 0's only (every ep rank holds as
// many). expert: the parameter's expert, -1 for a dense one.
template <class F>
void for_each_stage_param(const ModelLayout& layout, int pp_rank, F&& f) {
  for (int c = pp_rank; c < layout.num_chunks(); c += layout.pp)
    for (int i = layout.chunks[static_cast<size_t>(c)].begin; i < layout.chunks[static_cast<size_t>(c)].end; ++i) {
      const BlockSpec& blk = layout.blocks()[static_cast<size_t>(i)];
      for (size_t j = 0; j < blk.params.size(); ++j) {
        const int64_t e = layout.ep > 1 ? expert_of_param(blk, j) : -1;
        if (e < 0 || expert_owner_of_param(blk, j, layout.ep) == 0) f(c, i, blk.params[j], e);
      }
    }
}
}  // namespace

namespace {
// stage_keys' bucket keys from the placements of pp rank 0 (`placement`) and each parameter's owning pp rank: a
// placement differs between ranks only in owner and, through it, counts_in_norm.
StageKeys stage_keys_placed(const ModelLayout& layout, int pp_rank, int tp, int tp_rank,
                            const std::map<std::string, ParamPlacement>& placement,
                            const std::map<std::string, int>& owner_rank) {
  StageKeys s;
  s.params = stage_params(layout, pp_rank, tp, tp_rank);
  s.has_bucket_keys = true;
  // The rank's parameters as the trainer hands them to GradBuckets (train/setup.cpp): first use in chunk and block
  // order, with their placement (of a MoE layer's experts under ep, ep rank 0's: every ep rank holds as many); and
  // every block that writes each.
  std::map<std::string, size_t> key_of;
  for_each_stage_param(layout, pp_rank, [&](int c, int i, const ParamSpec& p, int64_t) {
    auto [it, fresh] = key_of.insert({p.name, s.keys.size()});
    if (fresh) {
      ParamPlacement pl = placement.at(p.name);
      pl.owner = owner_rank.at(p.name) == pp_rank;
      pl.counts_in_norm = pl.owner && !(tp_rank > 0 && p.split.replicated());
      // fp8: an FP8 GEMM's weight, in buckets apart under ZeRO-3 (zero2_buckets drops it for the other stages).
      s.keys.push_back({shape_numel(shard_shape(p.shape, p.split, tp, tp_rank)), c, i, pl.counts_in_norm, pl.tied,
                        pl.tp_replicated, pl.expert, layout.blocks()[size_t(i)].fp8.has_value() && p.fp8_gemm});
      s.writers.emplace_back();
    }
    s.writers[it->second].push_back(i);
  });
  return s;
}

// Each parameter's owning pipeline rank: that of the first block using it (ModelLayout::placements' rule).
std::map<std::string, int> owner_ranks(const ModelLayout& layout) {
  std::map<std::string, int> out;
  for (const BlockSpec& b : layout.blocks()) {
    const int rank = layout.pp_rank_of_chunk(layout.chunk_of_block(b.index));
    for (const ParamSpec& p : b.params) out.try_emplace(p.name, rank);
  }
  return out;
}
}  // namespace

StageKeys stage_keys(const ModelLayout& layout, int pp_rank, int tp, int tp_rank, bool with_bucket_keys) {
  if (!with_bucket_keys) {
    StageKeys s;
    s.params = stage_params(layout, pp_rank, tp, tp_rank);
    return s;
  }
  return stage_keys_placed(layout, pp_rank, tp, tp_rank, layout.placements(pp_rank, tp, tp_rank), owner_ranks(layout));
}

std::vector<StageKeys> all_stage_keys(const ModelLayout& layout, int tp, int tp_rank) {
  const auto placement = layout.placements(0, tp, tp_rank);
  const auto owners = owner_ranks(layout);
  std::vector<StageKeys> out;
  for (int p = 0; p < layout.pp; ++p) out.push_back(stage_keys_placed(layout, p, tp, tp_rank, placement, owners));
  return out;
}

ZeroTwoBuckets zero2_buckets(const Config& cfg, const ModelLayout& layout, int pp_rank, int tp_rank, int dp) {
  return zero2_buckets(cfg, layout, stage_keys(layout, pp_rank, int(cfg.parallel.tp), tp_rank, true), pp_rank, dp);
}

ZeroTwoBuckets zero2_buckets(const Config& cfg, const ModelLayout& layout, const StageKeys& stage, int pp_rank, int dp,
                             const std::vector<Action>* actions) {
  RELAY_ASSERT(stage.has_bucket_keys, "zero2_buckets: stage_keys built without bucket keys");
  const int edp = dp / layout.ep;
  ShardingInput in = sharding_input(cfg);
  in.replicas = dp;
  const GroupSharding dense = describe_sharding(in).group(GradGroup::dense);
  // GradBuckets keeps the FP8 GEMMs' weights apart under ZeRO-3 only.
  std::vector<BucketKey> unmarked;
  const bool any_fp8 = std::any_of(stage.keys.begin(), stage.keys.end(), [](const BucketKey& k) { return k.fp8; });
  if (any_fp8 && !dense.parameters) {
    unmarked = stage.keys;
    for (BucketKey& k : unmarked) k.fp8 = false;
  }
  const std::vector<BucketKey>& keys = unmarked.empty() ? stage.keys : unmarked;
  const std::vector<std::vector<int>>& writers = stage.writers;
  const BucketLayout bl = layout_buckets(keys, zero_bucket_caps(cfg), dp, edp);
  // A gathered bucket's bytes on the wire: its working dtype's, or its e4m3 codes' (parallel.fp8_param_gather;
  // GradBuckets' Bucket::fp8: the bucket's parameters are FP8 GEMMs' weights). Held: the codes and one f32 scale a
  // member; while its piece is quantised (GradBuckets::quantise_piece) also the piece in the working dtype and each
  // member's amax.
  const int64_t act = int64_t(dtype_size(compute_dtype(cfg.train.precision)));
  auto codes = [&](size_t g) { return cfg.parallel.fp8_param_gather && keys[bl.groups[g].front()].fp8; };
  auto gathered_bytes = [&](size_t g) {
    return (codes(g) ? int64_t(dtype_size(DType::fp8_e4m3)) : act) * bl.padded[g];
  };
  auto held_bytes = [&](size_t g) {
    return gathered_bytes(g) + (codes(g) ? 4 * int64_t(bl.groups[g].size()) : 0);
  };
  auto quantise_scratch = [&](size_t g) {
    return codes(g) ? act * bl.padded[g] / bl.shards[g] + 4 * int64_t(bl.groups[g].size()) : 0;
  };
  ZeroTwoBuckets z;
  std::map<int, std::vector<int>> buckets_of_block;  // as GradBuckets::watch: the sharded buckets only
  for (size_t g = 0; g < bl.groups.size(); ++g) {
    z.total_padded += bl.padded[g];
    if (bl.shards[g] == 1) {  // an expert's with no other copy: whole
      z.whole += bl.padded[g];
      continue;
    }
    z.shards += bl.padded[g] / bl.shards[g];
    for (size_t k : bl.groups[g])
      for (int w : writers[k]) {
        auto& mine = buckets_of_block[w];
        if (std::find(mine.begin(), mine.end(), int(g)) == mine.end()) mine.push_back(int(g));
      }
  }
  std::vector<std::vector<int>> chunk_param_blocks;
  for (int c = pp_rank; c < layout.num_chunks(); c += layout.pp) {
    chunk_param_blocks.emplace_back();
    for (int i = layout.chunks[static_cast<size_t>(c)].begin; i < layout.chunks[static_cast<size_t>(c)].end; ++i)
      if (!layout.blocks()[static_cast<size_t>(i)].params.empty()) chunk_param_blocks.back().push_back(i);
  }
  // ZeRO-3: the gathered units at their most. A block holds its units while it runs and the chunk's next block's are
  // prefetched (model/chunk.cpp), forward (i, then i + 1) and backward (i, then i - 1) alike; kept for the step,
  // every unit of the rank.
  if (dense.parameters) {
    z.kept = dense.gathered_kept;
    // GradBuckets::units_of(block): the block's sharded units in the order of its parameters' first use of them.
    std::map<int, std::vector<int>> gather_order;
    {
      std::vector<int> group_of(keys.size(), -1);
      for (size_t g = 0; g < bl.groups.size(); ++g)
        for (size_t k : bl.groups[g]) group_of[k] = int(g);
      for (size_t k = 0; k < keys.size(); ++k) {
        if (group_of[k] < 0 || bl.shards[size_t(group_of[k])] == 1) continue;
        for (int w : writers[k]) {
          auto& mine = gather_order[w];
          if (std::find(mine.begin(), mine.end(), group_of[k]) == mine.end()) mine.push_back(group_of[k]);
        }
      }
    }
    // Block b's units gathered, in order, beside `held` (n bytes): a unit's piece is quantised right after its own
    // buffer is allocated, next to the units held by then (not the ones gathered after it).
    auto gather_block = [&](int b, std::set<int>& held, int64_t& n) {
      auto it = gather_order.find(b);
      if (it == gather_order.end()) return;
      for (int g : it->second)
        if (held.insert(g).second) {
          n += held_bytes(size_t(g));
          z.gathered_peak_bytes = std::max(z.gathered_peak_bytes, n + quantise_scratch(size_t(g)));
        }
    };
    if (z.kept) {
      // Gathered in the order the step's first forward reaches them (chunk after chunk, block after block), kept.
      std::set<int> seen;
      int64_t held = 0;
      for (int c = pp_rank; c < layout.num_chunks(); c += layout.pp)
        for (int i = layout.chunks[size_t(c)].begin; i < layout.chunks[size_t(c)].end; ++i) gather_block(i, seen, held);
    } else {
      for (int c = pp_rank; c < layout.num_chunks(); c += layout.pp) {
        const ChunkRange& cr = layout.chunks[static_cast<size_t>(c)];
        for (int i = cr.begin; i < cr.end; ++i)
          for (int next : {i + 1, i - 1}) {  // block i's units, then the next block's (prefetched)
            std::set<int> held;
            int64_t n = 0;
            gather_block(i, held, n);
            if (next >= cr.begin && next < cr.end) gather_block(next, held, n);
          }
      }
    }
    // Gathers a step: every unit once when kept; else every block's units for its forward and its backward, per
    // micro-batch (a unit two blocks use, the tied embedding, twice each way).
    if (z.kept) {
      for (size_t g = 0; g < bl.groups.size(); ++g)
        if (bl.shards[g] != 1) z.gathered_bytes += gathered_bytes(g);
    } else {
      for (auto& [block, gs] : buckets_of_block)
        for (int g : gs) z.gathered_bytes += 2 * cfg.train.micro_batches * gathered_bytes(size_t(g));
    }
  }
  const auto writes = zero2_writes(chunk_param_blocks, buckets_of_block);
  // Replay one step's schedule through the pool as the chunks' hooks drive it (GradBuckets::before_weight_grads,
  // after_weight_grads and finish): nothing to wait for here.
  Zero2Pool pool;
  const Zero2Pool::Reclaim nothing = [](int) {};
  std::vector<int> open(bl.groups.size(), -1);
  const std::vector<Action> generated = actions ? std::vector<Action>() : generate_schedule(schedule_shape(cfg), pp_rank);
  for (const Action& a : actions ? *actions : generated) {
    if (a.op == Op::reduce_tied_grads || a.op == Op::optimizer_step) {
      pool.drain(nothing);
      continue;
    }
    if (a.op != Op::backward && a.op != Op::backward_weight) continue;
    const ChunkRange& cr = layout.chunks[static_cast<size_t>(a.chunk)];
    for (int i = cr.end; i-- > cr.begin;) {
      auto it = writes.find(i);
      if (it == writes.end()) continue;
      for (const Zero2Write& w : it->second)
        if (open[size_t(w.bucket)] < 0)
          open[size_t(w.bucket)] =
              pool.open(bl.padded[size_t(w.bucket)], bl.padded[size_t(w.bucket)] / bl.shards[size_t(w.bucket)], nothing);
      for (const Zero2Write& w : it->second)
        if (w.closes) {
          ++z.launches;
          z.launched_elements += bl.padded[size_t(w.bucket)];
          pool.close(open[size_t(w.bucket)], nothing);
          open[size_t(w.bucket)] = -1;
        }
    }
  }
  z.pool_elements = z.pool_piece_elements = 0;
  for (int64_t c : pool.capacities()) z.pool_elements += c;
  for (int64_t c : pool.piece_capacities()) z.pool_piece_elements += c;
  z.pool_buffers = static_cast<int64_t>(pool.capacities().size());
  return z;
}

StageParams stage_params(const ModelLayout& layout, int pp_rank, int tp, int tp_rank) {
  StageParams out;
  std::set<std::string> seen;
  for_each_stage_param(layout, pp_rank, [&](int, int block, const ParamSpec& p, int64_t e) {
    if (!seen.insert(p.name).second) return;
    const Shape shard = shard_shape(p.shape, p.split, tp, tp_rank);
    const int64_t n = shape_numel(shard);
    out.numel += n;
    if (e >= 0) out.expert += n;
    const std::optional<Fp8Recipe>& fp8 = layout.blocks()[size_t(block)].fp8;
    if (fp8 && p.fp8_cached())  // Fp8Linear's weight codes and their scales, experts' included
      out.fp8_cache_bytes += fp8_weight_cache_bytes(*fp8, shard[0], shard[1]);
  });
  return out;
}

MemoryBytes predict_memory(const Config& cfg, const ModelLayout& layout, int pp_rank, int tp_rank) {
  const bool buckets = describe_sharding(sharding_input(cfg)).group(GradGroup::dense).gradients;
  return predict_memory(cfg, layout, stage_keys(layout, pp_rank, int(cfg.parallel.tp), tp_rank, buckets), pp_rank,
                        tp_rank);
}

MemoryBytes predict_memory(const Config& cfg, const ModelLayout& layout, const StageKeys& stage, int pp_rank,
                           int tp_rank, const PlannedSchedule* schedule) {
  // Replicas: the dp x cp ranks holding the same parameters (ZeRO shards over them); a rank's rows: its T / cp of
  // every sequence of a micro-batch.
  const int tp = static_cast<int>(cfg.parallel.tp), cp = static_cast<int>(cfg.parallel.cp);
  const int dp = static_cast<int>(cfg.parallel.dp) * cp;
  const bool recompute = cfg.train.recompute == "blocks";
  const int64_t m = cfg.train.micro_batches, rows = micro_batch_rows(cfg) * layout.model.seq_len / cp;
  MemoryBytes b;
  // Parameters, gradients and optimizer state: every parameter of this rank's chunks once (stage_params).
  const StageParams& sp = stage.params;
  const int64_t numel = sp.numel, expert_numel = sp.expert;
  // What ZeRO shards (parallel/sharding.hpp): the dense parameters' over the dp x cp replicas, the experts' over the
  // replicas of the experts (none where they have no other copy); the gradients' bf16 wire copies where they move.
  const Sharding sh = describe_sharding(sharding_input(cfg));
  const GroupSharding &ds = sh.group(GradGroup::dense), &es = sh.group(GradGroup::expert);
  auto bf16_wire = [&](GradGroup g) {
    const Move* sum = sh.find(g, Moved::gradients);
    return sum && sum->dtype == DType::bf16;
  };
  const bool wire = bf16_wire(GradGroup::dense), ewire = bf16_wire(GradGroup::expert);
  const int64_t dense = numel - expert_numel;
  // Sizes in bytes: f32 masters, gradients and state; act: activations and working weights (bf16 under
  // train.precision = "bf16", f32 otherwise); the gradient wire copies of parallel.grad_reduce = "bf16".
  const int64_t f32 = 4, act = int64_t(dtype_size(compute_dtype(cfg.train.precision)));
  const bool mixed = act != f32;
  b.params = f32 * numel + (mixed ? act * numel : 0) + sp.fp8_cache_bytes;
  ZeroTwoBuckets z;
  // This rank's list: the search's planned schedule's, or generated here once (the ZeRO-2/3 replay and the slots
  // below both read it).
  const ScheduleShape shape = schedule_shape(cfg);
  std::vector<Action> own;
  if (schedule) {
    const ScheduleShape& s = schedule->shape;
    RELAY_ASSERT(s.kind == shape.kind && s.pp == shape.pp && s.v == shape.v && s.m == shape.m,
                 "predict_memory: a planned schedule of another shape");
  } else {
    own = generate_schedule(shape, pp_rank);
  }
  const std::vector<Action>& actions = schedule ? schedule->lists.at(size_t(pp_rank)) : own;
  if (ds.gradients) z = zero2_buckets(cfg, layout, stage, pp_rank, dp, &actions);
  // ZeRO-2, 3: the buckets with no other copy (experts when ep = dp x cp) are whole, parameters and gradients.
  if (ds.parameters) {
    b.params = f32 * z.shards + (f32 + (mixed ? act : 0)) * z.whole;  // the masters' pieces, the whole buckets
    b.gathered = z.gathered_peak_bytes;  // blocks gathered while they run (all freed after the step)
  }
  if (ds.grads == GradHold::step_buckets) {
    // ZeRO-3 under pp > 1: after the step only the shards; during it every sharded bucket whole, and its wire copy.
    b.grads = f32 * (z.shards + z.whole) + (wire ? 2 * z.shards : 0);
    b.step_grads = (f32 + (wire ? 2 : 0)) * (z.total_padded - z.whole);
  } else if (ds.grads == GradHold::pooled) {
    // ZeRO-2 (parallel/data_parallel.hpp): the shard of every bucket, and the pool of the largest bucket's buffers.
    const int64_t pool = z.pool_elements + z.pool_piece_elements;  // each buffer and its piece of the sum
    b.grads = f32 * (z.shards + z.whole) + f32 * pool + (wire ? 2 * pool : 0);
  } else {
    // The buckets, the ZeRO-1 shards of their sums, and their bf16 wire copies (dense, then the experts').
    auto grads = [&](int64_t n, bool z1, bool w, int d) {
      return f32 * n + (z1 ? f32 * n / d : 0) + (w ? 2 * n + (z1 ? 2 * n / d : 0) : 0);
    };
    b.grads = grads(dense, ds.optimizer_state, wire, ds.ranks) +
              grads(expert_numel, es.optimizer_state, ewire, es.ranks);
  }
  const int64_t moments = cfg.optimizer.name == "adamw" ? 2 : cfg.optimizer.momentum != 0 ? 1 : 0;
  b.optimizer = moments * f32 * (dense / ds.shards() + expert_numel / es.shards());
  // Activations: the schedule's slots per chunk (parallel/slot_plan.hpp), a boundary pair per
  // micro-batch, the loss's buffers per micro-batch on the last chunk.
  const SlotPlan plan = schedule ? SlotPlan() : plan_slots(actions, shape.m);
  auto slots = [&](int c) { return schedule ? int64_t(schedule->slots.at(size_t(c))) : int64_t(plan.slots.at(c)); };
  const int last = layout.num_chunks() - 1;
  for (int c = pp_rank; c <= last; c += layout.pp) {
    const ChunkRange& cr = layout.chunks[static_cast<size_t>(c)];
    const std::span<const BlockSpec> blocks(layout.blocks().data() + cr.begin, size_t(cr.end - cr.begin));
    const ChunkBytes cb = ModelChunk::planned_bytes(blocks, tp, tp_rank, rows, c == 0, c == last,
                                                    layout.model.language_model && c == last, recompute,
                                                    shape.kind == ScheduleKind::zb_h1, cfg.data.document_mask, cp);
    int64_t per_mb = 0;
    if (c == last) {
      const bool ce = layout.model.language_model || cfg.model.loss == "cross_entropy";
      per_mb += (ce ? 4 * rows : act * rows * layout.model.output_dim) + 4 * rows * 2;  // targets, losses, predictions
      if (tp > 1 && ce) per_mb += 4 * rows * 3;                                // row maxima, partial sums
    }
    b.activations += slots(c) * cb.slot + m * (cb.boundary + per_mb) + cb.scratch;
  }
  // Context parallelism: the rank's one CpAttention, shared by its attention blocks.
  if (cp > 1) {  // (the blocks copied only where there is something to find: each holds its parameters' names)
    std::vector<BlockSpec> mine;
    for (int c = pp_rank; c <= last; c += layout.pp)
      for (int i = layout.chunks[static_cast<size_t>(c)].begin; i < layout.chunks[static_cast<size_t>(c)].end; ++i)
        mine.push_back(layout.blocks()[static_cast<size_t>(i)]);
    b.activations += cp_attention_bytes(mine, tp, cp, rows,
                                        cp_overlaps(cfg.parallel.overlap));
  }
  // Sequence parallelism: the rank's one buffer of a micro-batch's every row (n, C), shared by its blocks.
  // With overlap (CPU) a second one, where a weight gradient's operand is gathered while the first is reduce-scattered:
  // allocated by GPT's and Llama's blocks when they run B and W together (not MLA's; not under zero-bubble schedules).
  if (cfg.parallel.sequence_parallel && tp > 1) {
    const int64_t one = sp_rows_bytes(rows, cfg.model.n_embd, compute_dtype(cfg.train.precision));
    bool second = false;
    if (tp_overlaps(cfg.parallel.overlap, resolve_device(cfg.train.device)) && shape.kind != ScheduleKind::zb_h1)
      for (int c = pp_rank; c <= last; c += layout.pp)
        for (int i = layout.chunks[size_t(c)].begin; i < layout.chunks[size_t(c)].end; ++i) {
          const BlockKind k = layout.blocks()[size_t(i)].kind;
          second = second || k == BlockKind::transformer || k == BlockKind::llama_layer;
        }
    b.activations += second ? 2 * one : one;
  }
  return b;
}

BlockElements block_elements(const ModelSpec& model, int tp, int ep) {
  BlockElements out;
  std::map<std::string, BlockElements::Shared> by_name;
  for (const BlockSpec& b : model.blocks) {
    double dense = 0, expert = 0;
    for (size_t j = 0; j < b.params.size(); ++j) {
      const ParamSpec& p = b.params[j];
      const bool is_expert = ep > 1 && expert_of_param(b, j) >= 0;
      if (is_expert && expert_owner_of_param(b, j, ep) != 0) continue;
      const double n = double(shape_numel(shard_shape(p.shape, p.split, tp, 0)));
      (is_expert ? expert : dense) += n;
      BlockElements::Shared& s = by_name[p.name];
      s.elements = n, s.expert = is_expert;
      s.users.push_back(b.index);
    }
    out.dense.push_back(dense);
    out.expert.push_back(expert);
  }
  for (auto& [name, s] : by_name)
    if (s.users.size() > 1) out.shared.push_back(std::move(s));
  return out;
}

std::vector<double> stage_slots(const Config& cfg) {
  const ScheduleShape shape = schedule_shape(cfg);
  std::vector<double> slots;
  for (int r = 0; r < shape.pp; ++r)
    slots.push_back(double(plan_slots(generate_schedule(shape, r), shape.m).slots.at(r)));
  return slots;
}

StageMemory stage_memory(const Config& cfg, const ModelSpec& model, const BlockElements* elements,
                         const std::vector<double>* slots) {
  StageMemory mem;
  const int pp = int(cfg.parallel.pp), tp = int(cfg.parallel.tp), cp = int(cfg.parallel.cp), ep = int(cfg.parallel.ep);
  if (cfg.parallel.stage_memory_gib <= 0 || pp < 2 || cfg.parallel.virtual_stages != 1) return mem;
  mem.budget = cfg.parallel.stage_memory_gib * double(int64_t(1) << 30);
  const ScheduleShape shape = schedule_shape(cfg);
  mem.slots = slots ? *slots : stage_slots(cfg);
  // Bytes an element of a parameter holds: predict_memory's rules for the ZeRO stage (its shards, not ZeRO-2's pool).
  const Sharding sh = describe_sharding(sharding_input(cfg));
  const double f32 = 4, act = double(dtype_size(compute_dtype(cfg.train.precision)));
  const double moments = cfg.optimizer.name == "adamw" ? 2 : cfg.optimizer.momentum != 0 ? 1 : 0;
  auto per_element = [&](GradGroup group) {
    const GroupSharding& g = sh.group(group);
    const Move* sum = sh.find(group, Moved::gradients);
    const double wire = sum && sum->dtype == DType::bf16 ? 2 : 0;
    const double params = g.parameters ? f32 / g.shards() : f32 + (act != f32 ? act : 0);
    const double grads = g.gradients ? (f32 + wire) / g.shards()
                                     : f32 + wire + (g.optimizer_state ? (f32 + wire) / g.ranks : 0);
    return params + grads + moments * f32 / g.shards();
  };
  const double dense_bytes = per_element(GradGroup::dense), expert_bytes = per_element(GradGroup::expert);
  const bool recompute = cfg.train.recompute == "blocks", zb = shape.kind == ScheduleKind::zb_h1;
  const int64_t m = cfg.train.micro_batches, rows = micro_batch_rows(cfg) * model.seq_len / cp;
  const int n = int(model.blocks.size());
  const bool ce = model.language_model || cfg.model.loss == "cross_entropy";
  const int64_t output_dim = model.output_dim;
  const bool language_model = model.language_model, documents = cfg.data.document_mask;
  // The chunks' planned bytes, one walk from each begin extended as far as asked (the partition asks for every span).
  struct Walks {
    ChunkBytesPlanner planner;
    std::vector<ChunkBytesPlanner::Walk> walk;  // (begin) through block reached[begin] - 1
    std::vector<int> reached;                   // (begin)
    std::vector<std::vector<ChunkBytes>> by_end;  // (begin, end - begin - 1)
  };
  auto walks = std::make_shared<Walks>(Walks{ChunkBytesPlanner(model.blocks, tp, 0, rows, recompute, zb, documents, cp),
                                             {}, {}, {}});
  // The parameters' bytes as prefix sums over blocks, and a parameter that several blocks use (a tied embedding) once
  // a stage: its bytes taken off again for each further block of the stage that uses it.
  const BlockElements own = elements ? BlockElements{} : block_elements(model, tp, ep);
  const BlockElements& el = elements ? *elements : own;
  std::vector<double> param_prefix(size_t(n) + 1, 0.0);
  for (int i = 0; i < n; ++i)
    param_prefix[size_t(i) + 1] =
        param_prefix[size_t(i)] + el.dense[size_t(i)] * dense_bytes + el.expert[size_t(i)] * expert_bytes;
  std::vector<std::pair<double, std::vector<int>>> tied;
  for (const BlockElements::Shared& t : el.shared)
    tied.push_back({t.elements * (t.expert ? expert_bytes : dense_bytes), t.users});
  const double budget = mem.budget;
  mem.bytes = [=](int begin, int end) {
    StageBytes s;
    s.held = param_prefix[size_t(end)] - param_prefix[size_t(begin)];
    for (const auto& [bytes, users] : tied) {
      const auto inside = std::count_if(users.begin(), users.end(), [&](int i) { return i >= begin && i < end; });
      if (inside > 1) s.held -= double(inside - 1) * bytes;
    }
    if (s.held > budget) return s;  // does not fit whatever its activations: spares the chunk's plan
    const bool last = end == n;
    Walks& w = *walks;
    if (w.walk.empty()) w.walk.resize(size_t(n)), w.reached.assign(size_t(n), -1), w.by_end.resize(size_t(n));
    const size_t b = size_t(begin);
    if (w.reached[b] < 0) w.walk[b] = w.planner.start(begin, begin == 0), w.reached[b] = begin;
    for (; w.reached[b] < end; ++w.reached[b]) {
      w.planner.add(w.walk[b], w.reached[b]);
      const bool at_end = w.reached[b] + 1 == n;
      w.by_end[b].push_back(w.walk[b].bytes(at_end, language_model && at_end));
    }
    const ChunkBytes cb = w.by_end[b][size_t(end - begin - 1)];
    double loss = 0;
    if (last) loss = double((ce ? 4 * rows : int64_t(act) * rows * output_dim) + 8 * rows + (tp > 1 && ce ? 12 * rows : 0));
    s.held += double(cb.scratch) + double(m) * (double(cb.boundary) + loss);
    s.per_slot = double(cb.slot);
    return s;
  };
  return mem;
}

MemoryBytes measured_memory() {
  return {mem_bytes(MemKind::params), mem_bytes(MemKind::grads), mem_bytes(MemKind::optimizer),
          mem_bytes(MemKind::activations)};
}

}  // namespace relay
