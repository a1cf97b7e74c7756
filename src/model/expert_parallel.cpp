// Expert parallelism's placement rules (model/expert_parallel.hpp); the exchange itself is in model/moe.cpp.
#include "model/expert_parallel.hpp"

namespace relay {

namespace {

// The inner MoE layer whose parameter spec.params[i] is (its index there in *j), or null: an inner block's parameters
// are one run of the outer block's list, found by name.
const BlockSpec* inner_moe_layer(const BlockSpec& spec, size_t i, size_t* j) {
  for (const BlockSpec& in : spec.inner) {
    if (!in.moe.on() || in.params.empty()) continue;
    const std::string& first = in.params.front().name;
    for (size_t p = 0; p + in.params.size() <= spec.params.size(); ++p)
      if (spec.params[p].name == first) {
        if (i >= p && i < p + in.params.size() && spec.params[i].name == in.params[i - p].name) {
          *j = i - p;
          return &in;
        }
        break;
      }
  }
  return nullptr;
}

}  // namespace

int64_t expert_of_param(const BlockSpec& spec, size_t i) {
  if (!spec.moe.on()) {
    size_t j = 0;
    const BlockSpec* in = spec.inner.empty() ? nullptr : inner_moe_layer(spec, i, &j);
    return in ? expert_of_param(*in, j) : -1;
  }
  const size_t experts = size_t(3 * spec.moe.n_experts), first = spec.params.size() - experts;
  return i >= first ? int64_t((i - first) / 3) : -1;
}

int64_t experts_of_param(const BlockSpec& spec, size_t i) {
  if (spec.moe.on()) return spec.moe.n_experts;
  size_t j = 0;
  const BlockSpec* in = spec.inner.empty() ? nullptr : inner_moe_layer(spec, i, &j);
  return in ? in->moe.n_experts : 0;
}

bool ExpertParallel::holds(const BlockSpec& spec, size_t i) const {
  const int owner = expert_owner_of_param(spec, i, size);
  return owner < 0 || owner == rank;
}

}  // namespace relay
