// Losses on the last chunk's output: cross_entropy (torch.nn.CrossEntropyLoss) and mse
// (torch.nn.MSELoss), both the mean over the global batch: each micro-batch's gradient is scaled by
// 1 / global batch, so gradients summed over micro-batches and replicas give the global mean.
#pragma once
#include <string>

#include "backend/backend.hpp"
#include "model/tensor_parallel.hpp"

namespace relay {

enum class LossKind { cross_entropy, mse };
LossKind parse_loss(const std::string& name);

class Loss {
 public:
  // width: this rank's columns. With tp.size > 1 (a vocabulary-parallel head) the logits are columns
  // [vocab_start, vocab_start + width) and the loss is Megatron-LM's vocabulary-parallel cross-entropy.
  // dtype: the predictions' (the model's activations); mse targets are stored in it too.
  Loss(Backend& be, LossKind kind, int64_t width, TensorParallel tp = {}, int64_t vocab_start = 0,
       DType dtype = DType::f32)
      : be_(be), kind_(kind), width_(width), tp_(tp), vocab_start_(vocab_start), dtype_(dtype) {}
  LossKind kind() const { return kind_; }
  // Targets buffer for a slot: i32 (rows) for cross_entropy, f32 (rows, width) for mse.
  Tensor targets(int slot, int64_t rows);
  // out (rows, width) -> the sum of per-sample losses (host double); writes d out into dout.
  double forward_backward(int slot, const Tensor& out, Tensor& dout, float grad_scale);
  // Evaluation: sum of losses, and of correct predictions (cross_entropy; 0 for mse).
  void evaluate(int slot, const Tensor& out, double& loss_sum, int64_t& correct);

 private:
  struct Slot { int64_t capacity = 0; Tensor targets, losses, predictions, row_max, partial; };
  Slot& slot(int s, int64_t rows);
  double sum_losses(const Tensor& losses);
  // The vocabulary-parallel cross-entropy: losses (rows); dout over this rank's columns when not null.
  void parallel_cross_entropy(Slot& sl, const Tensor& out, int64_t rows, float grad_scale, Tensor& losses,
                              Tensor* dout);
  // Correct predictions of the whole vocabulary's argmax (first maximum wins) over the tp group.
  int64_t parallel_correct(Slot& sl, const Tensor& out, int64_t rows);

  Backend& be_;
  LossKind kind_;
  int64_t width_;
  TensorParallel tp_;
  int64_t vocab_start_;
  DType dtype_ = DType::f32;
  std::vector<Slot> slots_;
  std::vector<float> host_losses_;
  std::vector<int32_t> host_i32_;
};

}  // namespace relay
