// What the step model (plan/step_model.hpp) reads from a layout's shape alone, (tp, cp, ep, pp, v) and sequence
// parallelism: the ModelLayout, the memory plan's stage keys of every pipeline rank, whether a weight is
// tied across stages and the checkpoint's bytes. Each walks every named parameter (DeepSeek-V3: 45,000), so the search
// builds them once per shape and reuses them across the micro-batchings, schedules, ZeRO stages and recomputation.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/config.hpp"
#include "parallel/slot_plan.hpp"
#include "train/memory_plan.hpp"
#include "train/model_layout.hpp"

namespace relay {

struct LayoutFacts {
  ModelLayout layout;
  // (pp) stage_keys of every pipeline rank (tp rank 0), bucket keys included: any rank may hold the most (a middle
  // rank of DeepSeek-V3 holds two MoE layers and more in-flight micro-batches than the last).
  std::vector<StageKeys> stages;
  bool tied = false;      // a parameter held by two pipeline ranks (layout.shared_params())
  double checkpoint_bytes = 0;
  BlockElements elements;  // the blocks' parameter elements on tp rank 0 (stage_memory's, for the memory term)
};

// One search's schedules, by shape (kind, pp, v, micro-batches, tied): plan_schedule's lists and slots, which the
// memory plan of every pipeline rank and the simulator read for every layout of that shape.
class ScheduleCache {
 public:
  // Throws the Error validate_schedule_shape throws for a shape the kind cannot run, every time.
  const PlannedSchedule& get(const ScheduleShape& shape);

 private:
  std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<PlannedSchedule>> schedules_;
};

// One search's facts, by shape. Every config asked for must share the base's model, optimizer and precision keys (the
// search varies only parallel.*, train.micro_batches and train.recompute, none of which the facts read besides the
// shape in the key). With parallel.stage_memory_gib the stages depend on the memory settings too: the shape's model is
// cut again for each config (parallel/partition.hpp's memory term) and the facts kept by shape and cut.
class LayoutCache {
 public:
  // schedules: the search's (kept across layout shapes), or nullptr for one of this cache's own.
  explicit LayoutCache(ScheduleCache* schedules = nullptr) : schedules_(schedules ? schedules : &own_schedules_) {}
  LayoutCache(const LayoutCache&) = delete;
  LayoutCache& operator=(const LayoutCache&) = delete;
  // The facts of cfg's shape, built on first use; throws the Error make_layout threw for this shape, every time.
  const LayoutFacts& get(const Config& cfg);
  size_t size() const { return facts_.size(); }
  ScheduleCache& schedules() { return *schedules_; }

 private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;  // tp, cp, ep, pp, v, sp
  struct Entry {
    std::unique_ptr<LayoutFacts> facts;
    std::string error;  // make_layout's refusal (the partition) for this shape
  };
  std::map<Key, Entry> facts_;  // the shape's, cut by compute alone
  std::map<std::pair<Key, std::vector<int>>, std::unique_ptr<LayoutFacts>> cut_;  // by shape and stage starts
  ScheduleCache own_schedules_;
  ScheduleCache* schedules_;  // the memory term's slots (one chunk a rank: stage_slots), for every cut
};

// The facts of cfg's layout, built fresh (what LayoutCache::get stores).
LayoutFacts layout_facts(const Config& cfg);
// The facts of `layout` (cfg's model and shape) with its stages replaced by `chunks`.
LayoutFacts layout_facts(const Config& cfg, ModelLayout layout, std::vector<ChunkRange> chunks);

}  // namespace relay
