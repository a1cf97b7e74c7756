// A model chunk: the contiguous slice of layers one pipeline stage (or, interleaved, one virtual
// stage) holds, with the activation and gradient buffers of every micro-batch in flight.
// Buffers are allocated on first use per slot and reused for every later step (no steady-state
// allocation). Backward is split into backward_input (B) and backward_weight (W) for zero-bubble
// schedules (Qi et al., arXiv:2401.10241); backward() runs both, layer by layer.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/layer.hpp"

namespace relay {

class ModelChunk {
 public:
  ModelChunk(Backend& be, int id, std::vector<std::unique_ptr<Layer>> layers, bool is_first, bool is_last);
  int id() const { return id_; }
  bool is_first() const { return is_first_; }
  bool is_last() const { return is_last_; }
  int64_t in_width() const { return layers_.front()->shape().in; }
  int64_t out_width() const { return layers_.back()->shape().out; }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  std::vector<Param*> params();  // in layer order

  // Where this slot's input goes (rows, in): data for the first chunk, received activations otherwise.
  Tensor input(int slot, int64_t rows);
  // Runs every layer; returns the output (rows, out).
  Tensor forward(int slot, int64_t rows);
  // The last forward's output (rows, out) and the last backward's input gradient (rows, in).
  Tensor forward_output(int slot, int64_t rows);
  Tensor input_grad(int slot, int64_t rows);
  // Where this slot's output gradient goes (rows, out): from the loss or received from the next chunk.
  Tensor output_grad(int slot, int64_t rows);
  // B: input gradients through every layer; returns d input (rows, in), undefined for the first chunk.
  Tensor backward_input(int slot, int64_t rows);
  // W: parameter gradients of every layer from the saved inputs and output gradients; `layer_done`
  // (may be empty) is called with a layer's config index as soon as its gradients are accumulated.
  void backward_weight(int slot, int64_t rows, const std::function<void(int)>& layer_done);
  // B and W together, layer by layer from the last, so early layers' gradients are final last.
  Tensor backward(int slot, int64_t rows, const std::function<void(int)>& layer_done);

 private:
  struct Slot {
    int64_t capacity = 0;
    std::vector<Tensor> acts;   // acts[k]: input of layer k (rows, width); acts[L] the output
    std::vector<Tensor> grads;  // grads[k]: gradient w.r.t. acts[k]
    std::vector<LayerSaved> saved;
  };
  Slot& slot(int s, int64_t rows);
  bool needs_input_grad(size_t k) const;

  Backend& be_;
  int id_;
  std::vector<std::unique_ptr<Layer>> layers_;
  bool is_first_, is_last_;
  size_t first_param_layer_;  // in the first chunk, no gradient is needed below this layer
  std::vector<Slot> slots_;
};

}  // namespace relay
