// The numeric precision of a run (train.precision) and the wire type of the gradient reduction
// (parallel.grad_reduce), parsed once from the config into these enums.
#pragma once
#include "core/tensor.hpp"

namespace relay {

// fp32: float32 storage and math;
// bf16: bfloat16 activations and working weights; float32 master weights, optimizer state, weight
//       gradients, statistics and GEMM accumulation (llm.c's and Megatron-LM's mixed precision);
// tf32: float32 storage, TF32 tensor-core GEMMs (CUDA only);
// fp8:  bf16's, but the linear layers' three GEMMs take FP8 operands scaled by train.fp8_recipe (model/fp8_linear.hpp).
enum class Precision { fp32, bf16, tf32, fp8 };
// How an FP8 GEMM's operands are scaled (core/fp8_scaling.hpp's tilings): tensorwise: one scale per tensor, inputs and
// weights e4m3, output gradients e5m2; blockwise: DeepSeek-V3's 1 x 128 tiles and 128 x 128 weight blocks, all e4m3.
enum class Fp8Recipe { tensorwise, blockwise };
// fp32: gradients are reduced as they accumulate, in float32; bf16: rounded to bf16 for the wire.
enum class GradReduce { fp32, bf16 };

const char* precision_name(Precision p);   // "fp32", "bf16", "tf32", "fp8"
const char* fp8_recipe_name(Fp8Recipe r);  // "tensorwise", "blockwise"
const char* grad_reduce_name(GradReduce g);  // "fp32", "bf16"
// The dtype activations and working weights have under p.
inline DType compute_dtype(Precision p) {
  return p == Precision::bf16 || p == Precision::fp8 ? DType::bf16 : DType::f32;
}

}  // namespace relay
