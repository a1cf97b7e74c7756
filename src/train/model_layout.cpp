#include "train/model_layout.hpp"

#include <algorithm>
#include <map>

#include "backend/backend.hpp"
#include "model/expert_parallel.hpp"
#include "model/fp8_linear.hpp"
#include "train/memory_plan.hpp"

namespace relay {

int ModelLayout::chunk_of_block(int block) const {
  for (int c = 0; c < num_chunks(); ++c)
    if (block >= chunks[static_cast<size_t>(c)].begin && block < chunks[static_cast<size_t>(c)].end) return c;
  RELAY_ASSERT(false, "block " << block << " is in no chunk");
}

std::vector<ParamEntry> ModelLayout::params() const {
  std::vector<ParamEntry> out;
  std::map<std::string, size_t> at;
  for (const BlockSpec& b : model.blocks) {
    const int rank = pp_rank_of_chunk(chunk_of_block(b.index));
    for (size_t i = 0; i < b.params.size(); ++i) {
      const ParamSpec& p = b.params[i];
      auto it = at.find(p.name);
      if (it == at.end()) {
        at[p.name] = out.size();
        out.push_back({p.name, p.shape, p.split, {rank}, ep > 1 ? expert_owner_of_param(b, i, ep) : -1});
      } else {
        auto& ranks = out[it->second].pp_ranks;
        if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) ranks.push_back(rank);
      }
    }
  }
  for (auto& e : out) std::stable_sort(e.pp_ranks.begin() + 1, e.pp_ranks.end());
  return out;
}

std::vector<ParamEntry> ModelLayout::shared_params() const {
  std::vector<ParamEntry> out;
  for (auto& e : params())
    if (e.pp_ranks.size() > 1) out.push_back(e);
  return out;
}

std::map<std::string, ParamPlacement> ModelLayout::placements(int pp_rank, int tp, int tp_rank) const {
  // One pass over the blocks: each name's pipeline ranks (first use first), its split and whether it is an expert's.
  struct Seen {
    std::vector<int> ranks;
    TpSplit split;
    bool expert = false;
  };
  std::map<std::string, Seen> seen;
  for (const BlockSpec& b : model.blocks) {
    const int rank = pp_rank_of_chunk(chunk_of_block(b.index));
    for (size_t i = 0; i < b.params.size(); ++i) {
      auto [it, fresh] = seen.try_emplace(b.params[i].name);
      Seen& s = it->second;
      if (fresh) s.split = b.params[i].split;
      s.expert = ep > 1 && expert_of_param(b, i) >= 0;
      if (std::find(s.ranks.begin(), s.ranks.end(), rank) == s.ranks.end()) s.ranks.push_back(rank);
    }
  }
  std::map<std::string, ParamPlacement> out;
  for (const auto& [name, s] : seen) {
    ParamPlacement p;
    p.tied = s.ranks.size() > 1;
    p.owner = s.ranks.front() == pp_rank;
    p.tp_replicated = tp > 1 && s.split.replicated();
    p.counts_in_norm = p.owner && !(tp_rank > 0 && s.split.replicated());
    p.expert = s.expert;
    out.emplace(name, p);
  }
  return out;
}

ParamPlacement ModelLayout::placement(const std::string& name, int pp_rank, int tp, int tp_rank) const {
  const auto all = placements(pp_rank, tp, tp_rank);
  auto it = all.find(name);
  RELAY_ASSERT(it != all.end(), "parameter " << name << " is not in the model");
  return it->second;
}

int64_t ModelLayout::param_count() const {
  int64_t n = 0;
  for (auto& e : params()) n += shape_numel(e.shape);
  return n;
}

ModelLayout make_layout(const Config& cfg, int64_t input_dim, const std::vector<double>& measured_costs) {
  ModelLayout l;
  l.model = make_model_spec(cfg, input_dim);
  check_fp8_widths(l.model.blocks);  // with the data's real input width (make_model_spec's callers may pass 1)
  // (the device asked only under ep: with "auto" it counts the GPUs)
  const int parts = cfg.parallel.ep > 1 && ep_overlaps(cfg.parallel.overlap, cfg.parallel.ep,
                                                       resolve_device(cfg.train.device)) ? 2 : 1;
  const auto set_moe = [&](BlockSpec& b) {
    if (!b.moe.on()) return;
    b.moe.ep = static_cast<int>(cfg.parallel.ep), b.moe.cp = static_cast<int>(cfg.parallel.cp);
    b.moe.parts = b.moe.n_experts / b.moe.ep >= 2 ? parts : 1;  // two parts: half of a rank's experts each
  };
  for (BlockSpec& b : l.model.blocks) {
    set_moe(b);
    for (BlockSpec& in : b.inner) set_moe(in);  // an MTP block's decoder layers: their experts split as the main ones'
  }
  l.pp = static_cast<int>(cfg.parallel.pp);
  l.ep = static_cast<int>(cfg.parallel.ep);
  l.v = static_cast<int>(cfg.parallel.virtual_stages);
  // parallel.stage_memory_gib: the stages chosen among those that fit it (train/memory_plan.hpp states their bytes).
  l.chunks = partition_blocks(l.model.blocks, l.pp * l.v, cfg.parallel.balance, measured_costs,
                              cfg.parallel.balance.empty() ? stage_memory(cfg, l.model) : StageMemory{});
  return l;
}

ScheduleShape schedule_shape(const Config& cfg) {
  ScheduleShape s{parse_schedule_kind(cfg.parallel.schedule), static_cast<int>(cfg.parallel.pp),
                  static_cast<int>(cfg.parallel.virtual_stages), static_cast<int>(cfg.train.micro_batches)};
  validate_schedule_shape(s);
  return s;
}

int64_t micro_batch_rows(const Config& cfg) {
  // B = dp x micro_batches x micro-batch size.
  const int64_t B = cfg.train.batch_size, m = cfg.train.micro_batches, dp = cfg.parallel.dp;
  if (B % (dp * m) != 0)
    throw Error(cat("train.batch_size = ", B, " must be divisible by parallel.dp x train.micro_batches = ", dp, " x ", m,
                    " = ", dp * m, " (each replica splits its share into equal micro-batches)"));
  return B / (dp * m);
}

}  // namespace relay
