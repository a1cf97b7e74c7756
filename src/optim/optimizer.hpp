// Optimizers with torch.optim's exact update rules (AdamW: Loshchilov & Hutter, decoupled weight
// decay with bias correction; SGD with momentum as torch.optim.SGD, dampening 0, no Nesterov).
// State tensors are named as in torch.optim's state: exp_avg, exp_avg_sq, momentum_buffer.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/config.hpp"
#include "model/param.hpp"

namespace relay {

// What one optimizer updates: a parameter's value and gradient, or (ZeRO-1) the contiguous piece of
// them this rank owns, elements [offset, offset + numel) of the parameter's (local shard's) flat data.
struct OptimSlice {
  Param* param;
  Tensor value, grad;  // same shape
  int64_t offset = 0;
  Tensor work;         // the bf16 working copy the update also writes, or undefined
};
inline OptimSlice whole(Param* p) { return {p, p->value, p->grad, 0, p->work}; }

struct OptimizerState {
  std::string kind;    // "exp_avg", "exp_avg_sq", "momentum_buffer"
  std::string param;   // "0.weight"
  Tensor* tensor;      // the slice's state (numel of the slice)
  int64_t offset = 0;  // the slice's first element in the parameter's local flat data
};

// One update done in groups of slices, each group followed by `after(group)` (ZeRO-1/2: a bucket's pieces, then its
// parameter all-gather issued at once; parallel/data_parallel.hpp's update_groups). Every slice in exactly one group.
// Each element's arithmetic is the same as in one update of every slice: the same bits.
struct UpdateGroups {
  std::vector<std::vector<size_t>> slices;  // (groups) indices into the optimizer's slices, in update order
  std::function<void(size_t group)> after;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of every parameter with learning rate lr, in one pass or (groups) group after group; increments
  // step_count() once.
  virtual void step(double lr, const UpdateGroups* groups = nullptr) = 0;
  // Every state tensor, for checkpoints.
  virtual std::vector<OptimizerState> state() = 0;
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }

 protected:
  int64_t step_ = 0;  // updates done so far
};

std::unique_ptr<Optimizer> make_optimizer(const Config::Optimizer& cfg, Backend& be, std::vector<OptimSlice> slices);

// Learning rate for update number `step` (1-based) of `total`: "constant", or "cosine" = linear
// warm-up over warmup_steps, then cosine decay reaching min_lr at the last step.
double learning_rate(const Config::LrSchedule& s, double base_lr, int64_t step, int64_t total);

// torch.nn.utils.clip_grad_norm_: gradients are multiplied by min(1, max_norm / (total_norm + 1e-6));
// returns that factor (1 when max_norm is 0, i.e. clipping is off).
double clip_factor(double total_norm, double max_norm);

}  // namespace relay
