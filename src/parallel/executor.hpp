// The executor: a plain interpreter of one rank's schedule (schedule.hpp), validated beforehand by
// the simulator. It runs forwards and backwards on the rank's model chunks, moves activations and
// gradients between stages with non-blocking point-to-point, and starts gradient-bucket
// all-reduces as soon as the last micro-batch's weight gradients are final.
#pragma once
#include <map>
#include <vector>

#include "comm/communicator.hpp"
#include "model/chunk.hpp"
#include "model/loss.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/process_grid.hpp"
#include "parallel/schedule.hpp"

namespace relay {

// A replica's slice of one global batch on the host: inputs (rows, D) on the first stage, targets
// (rows) class indices or (rows, K) dense on the last; micro-batch i is rows [i*mb_rows, (i+1)*mb_rows).
struct StepData {
  const float* inputs = nullptr;
  const int32_t* class_targets = nullptr;
  const float* dense_targets = nullptr;
};

struct StepStats {
  double loss_sum = 0;     // sum of per-sample losses of this rank's micro-batches (last stage only)
  double compute_s = 0;    // time in forward/backward actions
  double wait_s = 0;       // time blocked in receives and the final waits: the measured bubble
  double step_s = 0;
};

class Executor {
 public:
  // chunks: this rank's chunks by global chunk id. loss: non-null on the rank holding the last chunk.
  Executor(Backend& be, const ProcessGrid& grid, Communicator& pp_comm, std::map<int, ModelChunk*> chunks,
           Loss* loss, GradBuckets& buckets, const ScheduleShape& shape, std::vector<Action> actions,
           int64_t mb_rows, int64_t global_batch);
  // Runs every action up to and including optimizer_step's synchronisation point: afterwards the
  // gradients are averaged over data-parallel replicas and ready for clipping and the update.
  StepStats run_step(const StepData& data);
  // Forward only over `rows` samples (eval); returns on the last stage the loss sum and correct count.
  void evaluate(int64_t rows, const StepData& data, double& loss_sum, int64_t& correct);

 private:
  int peer_of_chunk(int chunk) const { return chunk % shape_.pp; }  // pp_comm rank
  int tag(int kind, int chunk, int mb) const;
  ModelChunk& chunk(int c);
  void upload_targets(int slot, int64_t row0, int64_t rows, const StepData& d);
  void wait_all_sends();

  Backend& be_;
  const ProcessGrid& grid_;
  Communicator& comm_;
  std::map<int, ModelChunk*> chunks_;
  Loss* loss_;
  GradBuckets& buckets_;
  ScheduleShape shape_;
  std::vector<Action> actions_;
  int64_t mb_rows_;
  float grad_scale_;
  int last_chunk_;
  std::vector<RequestPtr> sends_;
  std::map<int, int> weight_done_;  // chunk -> micro-batches whose weight gradients are done this step
};

}  // namespace relay
