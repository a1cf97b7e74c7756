// FlashAttention-2 causal self-attention on the GPU (Dao et al. arXiv:2205.14135; Dao arXiv:2307.08691),
// the twin of kernels/cpu/flash_attention.cpp: the result of attention_forward / attention_backward
// without the (B, H, T, T) probabilities. X is the storage type (float or __nv_bfloat16); math is float.
// Layout as the CPU's: qkv (B*T, 3C) rows [q | k | v], head h at columns [h*hd, (h+1)*hd) of each part,
// hd = C / H, scale 1 / sqrt(hd), query t sees keys s <= t.
// Head sizes: any hd in [1, kFlashMaxHeadDim]; the launchers refuse others. The grouped-query launchers also take a
// value head width hd_v of its own (DeepSeek-V3's MLA: hd 192, hd_v 128), in the same range.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

constexpr int64_t kFlashMaxHeadDim = 192;

// qkv (B*T, 3C) -> out (B*T, C), lse (B, H, T) float32: the natural log-sum-exp of each query row's
// scaled scores, saved for the backward.
template <typename X>
void flash_attention_forward(const X* qkv, X* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H,
                             const int32_t* doc_start, cudaStream_t stream);
// dout (B*T, C), and qkv, out, lse of the forward -> dqkv (B*T, 3C), overwritten (not accumulated).
// scratch: (B, H, T) floats of device memory for D = rowsum(dout * out). Deterministic: no atomics, every
// output element summed by one thread in a fixed order.
// doc_start (every launcher; device, B*T, or null): data.document_mask's first visible key of each query, as the CPU
// kernels take it (kernels/cpu/flash_attention.hpp): query t sees keys [doc_start[t], t]; documents contiguous.
template <typename X>
void flash_attention_backward(const X* dout, const X* qkv, const X* out, const float* lse, X* dqkv, float* scratch,
                              int64_t B, int64_t T, int64_t C, int64_t H, const int32_t* doc_start,
                              cudaStream_t stream);

// Grouped-query attention on strided row views: q (B*T rows, ldq apart) holds H heads of hd columns, k (B*T rows,
// ldk apart) KV heads of hd columns, v (B*T rows, ldv apart) KV heads of hd_v columns; query head h reads key/value
// head h / (H / KV). out (B*T, H*hd_v), lse (B, H, T), scale 1 / sqrt(hd); dq (rows ldq apart), dk (ldk apart), dv
// (ldv apart) overwritten, a key/value head's gradients summed over its query heads in order (deterministic);
// dout (B*T, H*hd_v). scratch: (B, H, T) floats. bf16 with hd == hd_v in {64, 128} and ldk == ldv: the tensor cores.
template <typename X>
void flash_attention_gqa_forward(const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk, int64_t ldv, X* out,
                                 float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t hd_v,
                                 const int32_t* doc_start, cudaStream_t stream);
template <typename X>
void flash_attention_gqa_backward(const X* dout, const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk,
                                  int64_t ldv, const X* out, const float* lse, X* dq, X* dk, X* dv, float* scratch,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t hd_v,
                                  const int32_t* doc_start, cudaStream_t stream);

// Positioned queries (context parallelism: a rank's chunks of each sequence against its gathered keys), the twin of
// the CPU's flash_attention_gqa_forward_at: q (B*Tq rows, ldq apart), k (B*Tk rows, ldk apart), v (B*Tk rows, ldv
// apart), Tk >= Tq; q_pos (device, B*Tq, required): query t of sequence b sits at key position q_pos[b*Tq + t],
// non-decreasing in t and < Tk, and sees keys [doc_start[b*Tq + t] (or 0), q_pos[b*Tq + t]]. out (B*Tq, H*hd_v), lse
// (B, H, Tq). The backward overwrites dq (rows ldq apart), dk (B*Tk rows, ldk apart) and dv (ldv apart) with the
// gradients from these queries alone (0 for keys none of them sees); scratch: (B, H, Tq) floats. Always the scalar
// kernels.
template <typename X>
void flash_attention_gqa_forward_at(const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk, int64_t ldv, X* out,
                                    float* lse, int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H,
                                    int64_t KV, int64_t hd, int64_t hd_v, const int32_t* doc_start,
                                    cudaStream_t stream);
template <typename X>
void flash_attention_gqa_backward_at(const X* dout, const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk,
                                     int64_t ldv, const X* out, const float* lse, X* dq, X* dk, X* dv, float* scratch,
                                     int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H, int64_t KV,
                                     int64_t hd, int64_t hd_v, const int32_t* doc_start, cudaStream_t stream);

}  // namespace relay::cuda
