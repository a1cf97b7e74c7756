#include "plan/layout_cache.hpp"

#include "core/error.hpp"
#include "train/checkpointing.hpp"

namespace relay {

LayoutFacts layout_facts(const Config& cfg) {
  LayoutFacts f;
  f.layout = make_layout(cfg, 0);
  const int tp = int(cfg.parallel.tp);
  f.stages = all_stage_keys(f.layout, tp, 0);
  f.tied = !f.layout.shared_params().empty();
  f.checkpoint_bytes = double(checkpoint_bytes(f.layout, cfg.optimizer));
  return f;
}

const LayoutFacts& LayoutCache::get(const Config& cfg) {
  const auto& p = cfg.parallel;
  const Key key{p.tp, p.cp, p.ep, p.pp, p.virtual_stages, p.sequence_parallel};
  auto [it, fresh] = facts_.try_emplace(key);
  Entry& e = it->second;
  if (fresh) {
    try {
      e.facts = std::make_unique<LayoutFacts>(layout_facts(cfg));
    } catch (const Error& err) {
      e.error = err.what();
    }
  }
  if (!e.facts) throw Error(e.error);
  return *e.facts;
}

}  // namespace relay
