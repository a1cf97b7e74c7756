// Expert parallelism's placement rules (model/expert_parallel.hpp); the exchange itself is in model/moe.cpp.
#include "model/expert_parallel.hpp"

namespace relay {

int64_t expert_of_param(const BlockSpec& spec, size_t i) {
  if (!spec.moe.on()) return -1;
  const size_t experts = size_t(3 * spec.moe.n_experts), first = spec.params.size() - experts;
  return i >= first ? int64_t((i - first) / 3) : -1;
}

bool ExpertParallel::holds(const BlockSpec& spec, size_t i) const {
  const int64_t e = expert_of_param(spec, i);
  return e < 0 || expert_owner(e, spec.moe.n_experts, size) == rank;
}

}  // namespace relay
