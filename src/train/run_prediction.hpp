// The planner's prediction for a run's own layout and machine (relay train --plan-cluster FILE; src/plan/ makes it in
// the CLI, so that training never depends on the planner): the first record of metrics.jsonl, {"plan": {...}}, and
// the predicted side of the predicted-vs-measured table at the end of the run.
#pragma once
#include <string>

namespace relay {

struct RunPrediction {
  std::string json;             // the record's object; empty: no prediction
  double step_time_s = 0;       // a step
  double compute_s = 0;         // the busiest pipeline rank's compute a step
  double wait_s = 0;            // the step beyond that compute: bubble and exposed communication
  double memory_bytes = 0;      // rank 0's planned bytes (pipeline rank 0, tp rank 0)
  bool on() const { return !json.empty(); }
};

}  // namespace relay
