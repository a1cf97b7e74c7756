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
  // This rank's tp shard of the whole tensor's initial values (every layout starts from the same weights).
  auto shard_values = [spec, seed = seed_, tp = tp_, tp_rank = tp_rank_, local]() {
    auto v = initial_values(spec, seed);
    if (shape_numel(local) == shape_numel(spec.shape)) return v;
    std::vector<float> shard(static_cast<size_t>(shape_numel(local)));
    extract_shard(v.data(), spec.shape, spec.split, tp, tp_rank, shard.data());
    return shard;
  };
  params_.push_back({spec.name, Tensor(), {}, spec.shape, spec.split, {}, local, {}});  // work: below on bf16 runs
  Param* p = &params_.back();
  p->work_dtype = work_dtype_;
  by_name_[spec.name] = p;
  p->initial = shard_values;
  if (!defer_) p->materialize(be_);  // ZeRO-3: GradBuckets takes this rank's piece of the values; nothing whole
  return p;
}

void Param::materialize(Backend& be) {
  MemoryScope scope(MemKind::params);
  value = Tensor(be, shape);
  const std::vector<float> v = initial();
  be.upload(value, v.data());
  if (work_dtype != DType::f32) {
    work = Tensor(be, shape, work_dtype);
    refresh_work(be);
  }
  initial = nullptr;
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
