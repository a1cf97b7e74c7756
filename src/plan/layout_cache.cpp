#include "plan/layout_cache.hpp"

#include "core/error.hpp"
#include "train/checkpointing.hpp"

namespace relay {

LayoutFacts layout_facts(const Config& cfg) { return layout_facts(cfg, make_layout(cfg, 0), {}); }

LayoutFacts layout_facts(const Config& cfg, ModelLayout layout, std::vector<ChunkRange> chunks) {
  LayoutFacts f;
  f.layout = std::move(layout);
  if (!chunks.empty()) f.layout.chunks = std::move(chunks);
  const int tp = int(cfg.parallel.tp);
  f.stages = all_stage_keys(f.layout, tp, 0);
  f.tied = !f.layout.shared_params().empty();
  f.checkpoint_bytes = double(checkpoint_bytes(f.layout, cfg.optimizer));
  return f;
}

const PlannedSchedule& ScheduleCache::get(const ScheduleShape& shape) {
  auto& s = schedules_[{int(shape.kind), shape.pp, shape.v, shape.m, shape.tied}];
  if (!s) s = std::make_unique<PlannedSchedule>(plan_schedule(shape));
  return *s;
}

const LayoutFacts& LayoutCache::get(const Config& cfg) {
  const auto& p = cfg.parallel;
  const Key key{p.tp, p.cp, p.ep, p.pp, p.virtual_stages, p.sequence_parallel};
  auto [it, fresh] = facts_.try_emplace(key);
  Entry& e = it->second;
  if (fresh) {
    try {
      Config compute_only = cfg;
      compute_only.parallel.stage_memory_gib = 0;
      e.facts = std::make_unique<LayoutFacts>(layout_facts(compute_only));
    } catch (const Error& err) {
      e.error = err.what();
    }
  }
  if (!e.facts) throw Error(e.error);
  const bool cut_by_memory =
      p.balance.empty() && p.stage_memory_gib > 0 && p.pp > 1 && p.virtual_stages == 1;
  if (!cut_by_memory) return *e.facts;
  if (e.facts->elements.dense.empty()) e.facts->elements = block_elements(e.facts->layout.model, int(p.tp), int(p.ep));
  const PlannedSchedule& schedule = schedules_->get(schedule_shape(cfg));
  const std::vector<double> slots(schedule.slots.begin(), schedule.slots.end());  // stage_slots(cfg): v = 1
  const StageMemory memory = stage_memory(cfg, e.facts->layout.model, &e.facts->elements, &slots);
  if (!memory.on()) return *e.facts;
  // make_layout's cut for cfg, from the shape's model (its experts already split over ep).
  const ModelLayout& base = e.facts->layout;
  std::vector<ChunkRange> chunks = partition_blocks(base.model.blocks, base.num_chunks(), {}, {}, memory);
  std::vector<int> starts;
  for (const ChunkRange& c : chunks) starts.push_back(c.begin);
  bool same = chunks.size() == base.chunks.size();
  for (size_t c = 0; same && c < chunks.size(); ++c) same = chunks[c].begin == base.chunks[c].begin;
  if (same) return *e.facts;
  auto& cut = cut_[{key, starts}];
  if (!cut) cut = std::make_unique<LayoutFacts>(layout_facts(cfg, base, std::move(chunks)));
  return *cut;
}

}  // namespace relay
