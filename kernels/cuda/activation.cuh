// Activation functions forward and backward: relu, gelu (exact erf form, torch.nn.GELU()), tanh and
// gelu_tanh (GPT-2's tanh approximation, torch.nn.GELU(approximate="tanh")).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

enum class ActKind { relu, gelu, tanh, gelu_tanh };  // the kernels' own copy; the backend maps relay::Activation

// X: float or __nv_bfloat16 storage, float math.
// y (count) = act(x)
template <typename X>
void activation_forward(ActKind act, const X* x, X* y, int64_t count, cudaStream_t stream);
// dx (count) = dy * act'(x); dx may alias dy.
template <typename X>
void activation_backward(ActKind act, const X* x, const X* dy, X* dx, int64_t count, cudaStream_t stream);

}  // namespace relay::cuda
