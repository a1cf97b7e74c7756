#include "parallel/slot_plan.hpp"

#include <set>

namespace relay {

SlotPlan plan_slots(const std::vector<Action>& actions, int m) {
  SlotPlan plan;
  // The action after which each (chunk, micro-batch) is done: its last compute action.
  std::map<std::pair<int, int>, size_t> last;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.op == Op::forward || a.op == Op::backward || a.op == Op::backward_input || a.op == Op::backward_weight)
      last[{a.chunk, a.micro_batch}] = i;
  }
  std::map<int, std::set<int>> free;  // chunk -> free slots below slots[chunk]
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.micro_batch < 0 || a.chunk < 0) continue;
    auto& of = plan.slot_of[a.chunk];
    if (of.empty()) of.assign(static_cast<size_t>(m), -1);
    int& s = of[static_cast<size_t>(a.micro_batch)];
    if (s < 0 && (a.op == Op::recv_activation || a.op == Op::forward)) {  // first touch: lowest free slot
      auto& f = free[a.chunk];
      if (f.empty()) f.insert(plan.slots[a.chunk]++);
      s = *f.begin();
      f.erase(f.begin());
    }
    RELAY_ASSERT(s >= 0, "slot plan: " << to_string(a) << " before the micro-batch's forward");
    if (last.count({a.chunk, a.micro_batch}) && last[{a.chunk, a.micro_batch}] == i) free[a.chunk].insert(s);
  }
  return plan;
}

PlannedSchedule plan_schedule(const ScheduleShape& s) {
  PlannedSchedule out{s, generate_all(s), std::vector<int>(size_t(num_chunks(s)), 0)};
  for (int rank = 0; rank < s.pp; ++rank)
    for (const auto& [chunk, n] : plan_slots(out.lists[size_t(rank)], s.m).slots) out.slots.at(size_t(chunk)) = n;
  return out;
}

}  // namespace relay
