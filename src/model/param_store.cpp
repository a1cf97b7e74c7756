// ParamStore and the initialisation rules (torch.nn.Linear's uniform bound for the MLP, GPT-2's normal).
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "model/param.hpp"

namespace relay {

uint64_t name_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<float> initial_values(const ParamSpec& spec, uint64_t model_seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(spec.shape)));
  const ParamInit& in = spec.init;
  if (in.kind == ParamInit::constant) {
    for (auto& x : v) x = float(in.a);
    return v;
  }
  Rng rng(model_seed, in.stream);
  for (uint64_t i = 0; i < in.skip; ++i) rng.next_u64();
  if (in.kind == ParamInit::uniform)
    for (auto& x : v) x = float(rng.uniform(-in.a, in.a));
  else
    for (auto& x : v) x = float(in.a * rng.normal());
  return v;
}

Param* ParamStore::get(const ParamSpec& spec) {
  if (Param* p = find(spec.name)) {
    RELAY_ASSERT(p->full_shape == spec.shape, "parameter " << spec.name << " requested with shape "
                                                             << shape_str(spec.shape) << " and "
                                                             << shape_str(p->full_shape));
    return p;
  }
  MemoryScope scope(MemKind::params);
  const Shape local = shard_shape(spec.shape, spec.split, tp_, tp_rank_);
  params_.push_back({spec.name, Tensor(be_, local), {}, spec.shape, spec.split, {}});  // work: set below on bf16 runs
  Param* p = &params_.back();
  auto v = initial_values(spec, seed_);
  if (p->sharded()) {
    std::vector<float> shard(static_cast<size_t>(shape_numel(local)));
    extract_shard(v.data(), spec.shape, spec.split, tp_, tp_rank_, shard.data());
    v = std::move(shard);
  }
  be_.upload(p->value, v.data());
  if (work_dtype_ != DType::f32) {
    p->work = Tensor(be_, local, work_dtype_);
    p->refresh_work(be_);
  }
  by_name_[spec.name] = p;
  return p;
}

Param* ParamStore::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<Param*> ParamStore::all() {
  std::vector<Param*> out;
  for (auto& p : params_) out.push_back(&p);
  return out;
}

}  // namespace relay
