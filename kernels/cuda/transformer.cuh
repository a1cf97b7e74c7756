// GPT-2's kernels on the GPU, the twins of kernels/cpu/transformer.cpp: token + position embedding
// and its deterministic backward (no atomics), causal multi-head self-attention forward/backward
// with the softmax probabilities saved, and one KV-cache decoding step. Correct first: every output
// element is computed by one thread in a fixed order (the fast attention is flash_attention.cuh).
// X is the storage type (float or __nv_bfloat16) where a launcher is a template; gradients of weights
// (dwte, dwpe) are float32; the reference attention with saved probabilities is float32 only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// out (rows, C) = wte[tokens[r]] + wpe[position of r]; tokens (rows) i32; the position is r % T, or positions[r]
// (device, rows; data.document_mask's restarting positions) when not null. wte holds table rows
// [vocab_start, vocab_start + vocab_rows) (vocabulary-parallel; other tokens give 0); wpe null: no positions.
template <typename X>
void embedding_forward(const int32_t* tokens, const X* wte, const X* wpe, X* out, int64_t rows, int64_t C, int64_t T,
                       int64_t vocab_start, int64_t vocab_rows, const int32_t* positions, cudaStream_t stream);
// dwte (vocab_rows, C) += scatter of dout (rows, C) by token; dwpe (T, C) += sum over rows by position (null:
// skipped). Deterministic: a token's (or position's) rows are summed in row order, then added. scratch:
// embedding_backward_scratch_bytes(rows) bytes of device memory, 256-byte aligned (the sort's keys, row indices
// and cub's temporary storage).
size_t embedding_backward_scratch_bytes(int64_t rows);
template <typename X>
void embedding_backward(const int32_t* tokens, const X* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows, const int32_t* positions, void* scratch,
                        cudaStream_t stream);
// qkv (B*T, 3C) [q | k | v] -> att (B, H, T, T) probabilities (0 above the diagonal), out (B*T, C).
void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H,
                       cudaStream_t stream);
// dout (B*T, C) -> dqkv (B*T, 3C), overwritten. scratch: (B, H, T, T) floats for the pre-softmax gradient.
void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, float* scratch, int64_t B,
                        int64_t T, int64_t C, int64_t H, cudaStream_t stream);
// One position t of n sequences: qkv (n, 3C); caches (n, Tmax, C), row t written; out (n, C). hd <= 256.
template <typename X>
void attention_decode(const X* qkv, X* kcache, X* vcache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t C,
                      int64_t H, cudaStream_t stream);
// Grouped-query decoding: q (n rows, ldq apart, H heads of hd), k, v (n rows, ldkv apart, KV heads); caches
// (n, Tmax, KV*hd), row t written; out (n, H*hd); query head h reads key/value head h / (H / KV). hd <= 256.
template <typename X>
void attention_decode_gqa(const X* q, int64_t ldq, const X* k, const X* v, int64_t ldkv, X* kcache, X* vcache, X* out,
                          int64_t n, int64_t t, int64_t Tmax, int64_t H, int64_t KV, int64_t hd, cudaStream_t stream);

}  // namespace relay::cuda
