// Activation slots from a schedule: which buffer set each micro-batch uses on each chunk. A slot is
// taken at the micro-batch's first action on the chunk (its recv_activation or forward) and given back
// after its last compute action (backward, or backward_weight in zero-bubble schedules), so a chunk
// needs as many slots as micro-batches it holds at once: m for GPipe, pp - rank for 1F1B's first
// chunk (Narayanan et al., arXiv:2104.04473), fewer still with recomputation's smaller slots. Pure.
#pragma once
#include <map>
#include <vector>

#include "parallel/schedule.hpp"

namespace relay {

struct SlotPlan {
  std::map<int, std::vector<int>> slot_of;  // chunk -> slot of each micro-batch (size m)
  std::map<int, int> slots;                 // chunk -> slots it needs
};

// actions: one pp rank's list for one step; m: micro-batches.
SlotPlan plan_slots(const std::vector<Action>& actions, int m);

// A schedule as the planner reads it for every layout of its shape: every rank's list and the slots each chunk needs.
// A function of the shape alone, so `relay plan --cluster`'s search builds it once a shape (plan/layout_cache.hpp).
struct PlannedSchedule {
  ScheduleShape shape;
  std::vector<std::vector<Action>> lists;  // (pp) generate_all(shape)
  std::vector<int> slots;                  // (pp x v chunks) plan_slots(the chunk's rank's list, m).slots[chunk]
};
PlannedSchedule plan_schedule(const ScheduleShape& s);

}  // namespace relay
