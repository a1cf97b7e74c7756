// Losses on the last chunk's output: cross_entropy (torch.nn.CrossEntropyLoss) and mse
// (torch.nn.MSELoss), both the mean over the global batch: each micro-batch's gradient is scaled by
// 1 / global batch, so gradients summed over micro-batches and replicas give the global mean.
#pragma once
#include <string>

#include "backend/backend.hpp"

namespace relay {

enum class LossKind { cross_entropy, mse };
LossKind parse_loss(const std::string& name);

class Loss {
 public:
  Loss(Backend& be, LossKind kind, int64_t width) : be_(be), kind_(kind), width_(width) {}
  LossKind kind() const { return kind_; }
  // Targets buffer for a slot: i32 (rows) for cross_entropy, f32 (rows, width) for mse.
  Tensor targets(int slot, int64_t rows);
  // out (rows, width) -> the sum of per-sample losses (host double); writes d out into dout.
  double forward_backward(int slot, const Tensor& out, Tensor& dout, float grad_scale);
  // Evaluation: sum of losses, and of correct predictions (cross_entropy; 0 for mse).
  void evaluate(int slot, const Tensor& out, double& loss_sum, int64_t& correct);

 private:
  struct Slot { int64_t capacity = 0; Tensor targets, losses, predictions; };
  Slot& slot(int s, int64_t rows);
  double sum_losses(const Tensor& losses);

  Backend& be_;
  LossKind kind_;
  int64_t width_;
  std::vector<Slot> slots_;
  std::vector<float> host_losses_;
  std::vector<int32_t> host_i32_;
};

}  // namespace relay
