// Activation functions forward and backward: relu, gelu (exact erf form, torch.nn.GELU()), tanh and
// gelu_tanh (GPT-2's tanh approximation, torch.nn.GELU(approximate="tanh")).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

enum class ActKind { relu, gelu, tanh, gelu_tanh };  // the kernels' own copy; the backend maps relay::Activation

// y (count) = act(x)
void activation_forward(ActKind act, const float* x, float* y, int64_t count, cudaStream_t stream);
// dx (count) = dy * act'(x); dx may alias dy.
void activation_backward(ActKind act, const float* x, const float* dy, float* dx, int64_t count,
                         cudaStream_t stream);

}  // namespace relay::cuda
