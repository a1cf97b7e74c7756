// attention_merge kernel: one thread per (sequence, head, query row), which reads both lse values, writes the merged
// one and rescales its row's hd values, exactly the CPU's rule in the CPU's order (kernels/cpu/attention_merge.cpp).
// Each thread owns its lse entry and its out slice, so there is no race and the result does not depend on the grid.
#include "kernels/cuda/attention_merge.cuh"

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

template <typename X>
__global__ void attention_merge_kernel(X* out, float* lse, const X* out2, const float* lse2, int64_t B, int64_t T,
                                       int64_t H, int64_t hd) {
  const int64_t C = H * hd;  // out's row width
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < B * H * T;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bh = i / T, t = i % T, b = bh / H, h = bh % H;  // i = bh * T + t: lse's (B, H, T) order
    const float l1 = lse[i], l2 = lse2[i];
    X* o1 = out + (b * T + t) * C + h * hd;         // (hd)
    const X* o2 = out2 + (b * T + t) * C + h * hd;  // (hd)
    if (l2 == -INFINITY) continue;                  // part 2 adds nothing to this row
    if (l1 == -INFINITY) {                          // part 1 adds nothing: out2 as it is
      for (int64_t j = 0; j < hd; ++j) o1[j] = o2[j];
      lse[i] = l2;
      continue;
    }
    const float mx = fmaxf(l1, l2), l = mx + logf(expf(l1 - mx) + expf(l2 - mx));
    const float w1 = expf(l1 - l), w2 = expf(l2 - l);
    for (int64_t j = 0; j < hd; ++j) store(o1[j], w1 * load(o1[j]) + w2 * load(o2[j]));
    lse[i] = l;
  }
}

// launchers -------------------------------------------------------------------------------------

template <typename X>
void attention_merge(X* out, float* lse, const X* out2, const float* lse2, int64_t B, int64_t T, int64_t H, int64_t hd,
                     cudaStream_t stream) {
  RELAY_ASSERT(B >= 0 && T >= 0 && H > 0 && hd > 0 && (B * T == 0 || (out && lse && out2 && lse2)),
               "attention_merge: B " << B << ", T " << T << ", H " << H << ", head dim " << hd);
  if (B * H * T == 0) return;
  attention_merge_kernel<X><<<grid_for(B * H * T), kBlock, 0, stream>>>(out, lse, out2, lse2, B, T, H, hd);
  CUDA_CHECK(cudaGetLastError());
}

#define INST(X)                                                                                                \
  template void attention_merge<X>(X*, float*, const X*, const float*, int64_t, int64_t, int64_t, int64_t, \
                                   cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
