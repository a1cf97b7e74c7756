// GPT-2's kernels on the GPU, the twins of kernels/cpu/transformer.cpp: token + position embedding
// and its deterministic backward (no atomics), causal multi-head self-attention forward/backward
// with the softmax probabilities saved, and one KV-cache decoding step. Correct first: every output
// element is computed by one thread in a fixed order (fast fused kernels are the GPU issue's work).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace relay::cuda {

// out (rows, C) = wte[tokens[r]] + wpe[r % T]; tokens (rows) i32. wte holds table rows
// [vocab_start, vocab_start + vocab_rows) (vocabulary-parallel; other tokens give 0); wpe null: no positions.
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int64_t rows, int64_t C,
                       int64_t T, int64_t vocab_start, int64_t vocab_rows, cudaStream_t stream);
// dwte (vocab_rows, C) += scatter of dout (rows, C) by token; dwpe (T, C) += sum over sequences (null: skipped).
// Deterministic.
void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows, cudaStream_t stream);
// qkv (B*T, 3C) [q | k | v] -> att (B, H, T, T) probabilities (0 above the diagonal), out (B*T, C).
void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H,
                       cudaStream_t stream);
// dout (B*T, C) -> dqkv (B*T, 3C), overwritten. scratch: (B, H, T, T) floats for the pre-softmax gradient.
void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, float* scratch, int64_t B,
                        int64_t T, int64_t C, int64_t H, cudaStream_t stream);
// One position t of n sequences: qkv (n, 3C); caches (n, Tmax, C), row t written; out (n, C). hd <= 256.
void attention_decode(const float* qkv, float* kcache, float* vcache, float* out, int64_t n, int64_t t, int64_t Tmax,
                      int64_t C, int64_t H, cudaStream_t stream);

}  // namespace relay::cuda
