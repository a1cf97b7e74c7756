// FlashAttention-2 on the tensor cores (mma.sync m16n8k16, bf16 operands, float accumulation) for bf16
// storage and head sizes 64 and 128: the fast path of flash_attention.cu's launchers, which fall back to
// their scalar kernels for float storage, other head sizes and unaligned views. Same arguments, layouts and
// results as flash_attention_gqa_forward / _backward (flash_attention.cuh), with FlashAttention-2's
// roundings: the probabilities P and the score gradients dS enter their GEMMs as bf16 (as in Dao's kernels
// and PyTorch's SDPA), everything else is float. Deterministic: every output element is summed by one
// thread in a fixed order (dQ by its own kernel, no atomics).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// True when the tensor-core kernels take this call: hd 64 or 128, 16-byte aligned rows (pointers and
// leading dimensions).
bool flash_mma_supported(int64_t hd, int64_t ldq, int64_t ldkv, const void* const* ptrs, int n_ptrs);

// q (B*T rows, ldq apart), k, v (ldkv apart) -> out (B*T, H*hd), lse (B, H, T). Requires flash_mma_supported.
// doc_start (device, B*T, or null): data.document_mask's first visible key of each query (flash_attention.cuh).
void flash_mma_forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t ldq,
                       int64_t ldkv, __nv_bfloat16* out, float* lse, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd, const int32_t* doc_start, cudaStream_t stream);

// row_dot (B, H, T) = rowsum(dout * out), computed by the caller; dq, dk, dv overwritten.
void flash_mma_backward(const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k,
                        const __nv_bfloat16* v, int64_t ldq, int64_t ldkv, const float* lse, const float* row_dot,
                        __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t hd, const int32_t* doc_start, cudaStream_t stream);

}  // namespace relay::cuda
