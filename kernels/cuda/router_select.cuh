// The routers' choice order and its warp-wide reduction (kernels/cuda/moe.cu's softmax top-k, moe_group_router.cu's
// group-limited top-k): one warp per token row, each lane holding its best candidate of the experts it scanned.
// Included only from .cu files.
#pragma once
#include <cuda_runtime.h>

namespace relay::cuda {

// Whether candidate (score sa, expert ea) is chosen before (sb, eb): the larger score, the lower expert on equal scores
// (the CPU scans experts upwards and replaces its best only on a strictly larger score). A strict total order on
// (score, expert) pairs, so a butterfly reduction leaves every lane with the same winner. The empty candidate is
// (-inf, INT_MAX): every expert, even one scoring -inf, comes before it.
__device__ inline bool chosen_before(float sa, int ea, float sb, int eb) { return sa > sb || (sa == sb && ea < eb); }

// Every lane's (score s, expert e, probability p) replaced by the warp's first in chosen_before's order.
__device__ inline void warp_best(float& s, int& e, float& p) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float os = __shfl_xor_sync(0xffffffffu, s, offset);
    const int oe = __shfl_xor_sync(0xffffffffu, e, offset);
    const float op = __shfl_xor_sync(0xffffffffu, p, offset);
    if (chosen_before(os, oe, s, e)) {
      s = os;
      e = oe;
      p = op;
    }
  }
}

}  // namespace relay::cuda
