// CPU reference kernels on raw row-major buffers. GEMMs go to oneDNN (the library PyTorch uses on
// CPU); the rest are OpenMP loops whose reduction order does not depend on the thread count, so one
// layout gives bitwise-identical results run after run. Kernels templated on X take float or bf16
// storage (kernels/cpu/instantiate.hpp) and always compute in float (statistics in double).
#pragma once
#include <cstdint>

#include "core/bf16.hpp"
#include "kernels/rope_angles.hpp"

namespace relay::cpu {

void set_threads(int threads);
int threads();

// c (m, n) = alpha * op(a) @ op(b) + beta * c; op(a) (m, k), op(b) (k, n); lda/ldb/ldc are row strides.
// f32 only; bf16 inputs or outputs and a fused bias: cpu::matmul (kernels/cpu/matmul.hpp).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

template <typename X, typename Y>
void convert(const X* x, Y* y, int64_t n);                                                // y = round(x)
template <typename X>
void fill(X* x, float v, int64_t n);
template <typename X>
void add_bias(X* y, const X* bias, int64_t rows, int64_t cols);                           // y (rows, cols) += bias
template <typename X>
void bias_grad(const X* dy, float* db, int64_t rows, int64_t cols, float beta);           // db = beta db + colsum(dy)
template <typename X>
void relu_forward(const X* x, X* y, int64_t n);
template <typename X>
void relu_backward(const X* x, const X* dy, X* dx, int64_t n);
template <typename X>
void gelu_forward(const X* x, X* y, int64_t n);                                           // exact erf form
template <typename X>
void gelu_backward(const X* x, const X* dy, X* dx, int64_t n);
template <typename X>
void gelu_tanh_forward(const X* x, X* y, int64_t n);                                      // GPT-2's tanh form
template <typename X>
void gelu_tanh_backward(const X* x, const X* dy, X* dx, int64_t n);
template <typename X>
void add(const X* a, const X* b, X* y, int64_t n);                                        // y may alias a or b
template <typename X>
void tanh_forward(const X* x, X* y, int64_t n);
template <typename X>
void tanh_backward(const X* x, const X* dy, X* dx, int64_t n);
template <typename X>
void scale(X* x, float s, int64_t n);
void fill_i32(int32_t* x, int32_t v, int64_t n);
double sum_squares(const float* x, int64_t n);

// LayerNorm over rows of x (rows, d), biased variance as torch.nn.LayerNorm; mean, rstd (rows) f32.
template <typename X>
void layernorm_forward(const X* x, const X* gamma, const X* beta, float eps, X* y, float* mean, float* rstd,
                       int64_t rows, int64_t d);
template <typename X>
void layernorm_backward_input(const X* dy, const X* x, const X* gamma, const float* mean, const float* rstd, X* dx,
                              int64_t rows, int64_t d);
template <typename X>
void layernorm_backward_weight(const X* dy, const X* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t rows, int64_t d);

// RMSNorm over rows of x (rows, d) as transformers' LlamaRMSNorm: y = x * rstd * gamma, rstd (rows) f32.
template <typename X>
void rmsnorm_forward(const X* x, const X* gamma, float eps, X* y, float* rstd, int64_t rows, int64_t d);
template <typename X>
void rmsnorm_backward_input(const X* dy, const X* x, const X* gamma, const float* rstd, X* dx, int64_t rows,
                            int64_t d);
template <typename X>
void rmsnorm_backward_weight(const X* dy, const X* x, const float* rstd, float* dgamma, int64_t rows, int64_t d);

// Llama's SwiGLU: h (n) = silu(gate) * up; backward dgate, dup (may alias dh, gate or up).
template <typename X>
void swiglu_forward(const X* gate, const X* up, X* h, int64_t n);
template <typename X>
void swiglu_backward(const X* dh, const X* gate, const X* up, X* dgate, X* dup, int64_t n);
// Mixture of experts (kernels/cpu/moe.cpp; Backend::moe_router_forward and friends say what each computes).
template <typename X>
void moe_router_forward(const X* logits, float* probs, float* lse, int32_t* experts, float* weights, int64_t n,
                        int64_t E, int64_t k, bool renormalize, const float* bias = nullptr);
template <typename X>
void moe_router_backward(const float* probs, const float* lse, const int32_t* experts, const float* dweights,
                         bool renormalize, const float* seq_grad, int64_t T, float z_scale, X* dlogits, int64_t n,
                         int64_t E, int64_t k);
// DeepSeek-V3's sigmoid, group-limited router (kernels/cpu/moe_group_router.cpp; Backend::moe_group_router_forward).
template <typename X>
void moe_group_router_forward(const X* logits, float* probs, int32_t* experts, float* weights, int64_t n, int64_t E,
                              int64_t k, int64_t n_group, int64_t topk_group, bool renormalize, float scale,
                              const float* bias);
template <typename X>
void moe_group_router_backward(const float* probs, const int32_t* experts, const float* dweights, bool renormalize,
                               float scale, const float* seq_grad, int64_t T, X* dlogits, int64_t n, int64_t E,
                               int64_t k);
template <typename X>
void moe_combine(const X* rows, const int32_t* pos, const float* weights, X* y, int64_t n, int64_t k, int64_t C);
template <typename X>
void moe_combine_backward(const X* dy, const X* rows, const int32_t* pos, const float* weights, X* drows,
                          float* dweights, int64_t n, int64_t k, int64_t C);
// Rotate-half rotary embedding of x (rows, heads * hd) into y (may alias x); row r at position pos0 + r % T, or
// pos0 + positions[r] (each < T: positions restarting with each document); inverse rotates by minus the angle
// (kernels/rope_angles.hpp has the angles; scaling: YaRN's frequencies and cos/sin factor, off by default).
template <typename X>
void rope(const X* x, X* y, int64_t rows, int64_t T, int64_t heads, int64_t hd, double theta, int64_t pos0,
          bool inverse, const int32_t* positions = nullptr, const RopeScaling& scaling = RopeScaling());

// The rotary part of each head, regrouped (DeepSeek-V3's MLA, transformers' apply_rotary_pos_emb_interleave):
// pe (rows, heads * dr) against columns [off, off + dr) of each head of x (rows, heads * w). gather: src x, dst pe;
// else src pe, dst x (x's other columns untouched). interleaved: x's pair (2i, 2i + 1) is pe's (i, dr/2 + i); else
// the columns as they are.
template <typename X>
void rotary_columns(const X* src, X* dst, int64_t rows, int64_t heads, int64_t w, int64_t off, int64_t dr,
                    bool interleaved, bool gather);

// Softmax cross-entropy; dlogits may be null (and may alias logits). Targets must be in [0, classes).
template <typename X>
void cross_entropy(const X* logits, const int32_t* targets, float grad_scale, float* losses, X* dlogits, int64_t rows,
                   int64_t classes);
template <typename X>
void mse(const X* pred, const X* target, float grad_scale, float* losses, X* dpred, int64_t rows, int64_t k);
template <typename X>
void argmax(const X* logits, int32_t* out, int64_t rows, int64_t classes);
// Vocabulary-parallel cross-entropy (Megatron-LM), see Backend::cross_entropy_partial.
template <typename X>
void row_max(const X* x, float* out, int64_t rows, int64_t cols);
template <typename X>
void cross_entropy_partial(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t rows, int64_t cols);
template <typename X>
void cross_entropy_finish(const X* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, X* dlogits, int64_t rows, int64_t cols);

// GPT-2 (kernels/cpu/transformer.cpp). tokens (rows), position of row r = r % T, or positions[r] (< T) when given.
// out (rows, C) = wte[tokens] + wpe[position]; backward: dwte, dwpe (f32) += (deterministic, no atomics).
// Vocabulary-parallel: wte holds rows [vocab_start, vocab_start + vocab_rows) of the table; other tokens
// contribute 0 (and no gradient). wpe / dwpe null: no positions.
template <typename X>
void embedding_forward(const int32_t* tokens, const X* wte, const X* wpe, X* out, int64_t rows, int64_t C, int64_t T,
                       int64_t vocab_start, int64_t vocab_rows, const int32_t* positions = nullptr);
template <typename X>
void embedding_backward(const int32_t* tokens, const X* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows, const int32_t* positions = nullptr);
// Causal self-attention, reference form: qkv (B*T, 3C) [q | k | v], att (B, H, T, T) probabilities, out (B*T, C).
void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H);
// dqkv (B*T, 3C) is overwritten.
void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, int64_t B, int64_t T,
                        int64_t C, int64_t H);
// One position t of n sequences: qkv (n, 3C); caches (n, Tmax, C), row t written; out (n, C).
template <typename X>
void attention_decode(const X* qkv, X* kcache, X* vcache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t C,
                      int64_t H);

// Grouped-query decoding: q (n rows, ldq apart, H heads of hd), k, v (n rows, ldkv apart, KV heads); caches
// (n, Tmax, KV*hd), row t written; out (n, H*hd). Query head h reads key/value head h / (H / KV).
template <typename X>
void attention_decode_gqa(const X* q, int64_t ldq, const X* k, const X* v, int64_t ldkv, X* kcache, X* vcache,
                          X* out, int64_t n, int64_t t, int64_t Tmax, int64_t H, int64_t KV, int64_t hd);
// Multi-head latent attention's absorbed decode (Backend::attention_decode_latent): q (n, H*dk) absorbed queries,
// kv (n, dk) position t's [latent (r) | rotary key]; cache (n, Tmax, dk), row t written; out (n, H*r), the
// attention-weighted sum of the cached latents (a position's first r values), scores times scale.
template <typename X>
void attention_decode_latent(const X* q, const X* kv, X* cache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t H,
                             int64_t dk, int64_t r, float scale);

// f32 masters and state; work (n) bf16 or null: the updated parameter rounded, in the same pass.
void adamw_step(float* p, const float* g, float* m, float* v, bf16* work, int64_t n, double lr, double beta1,
                double beta2, double eps, double weight_decay, int64_t step);
// One tensor of adamw_step_many: its n masters, gradient, state, and bf16 working copy (or null).
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  bf16* work;
  int64_t n;
};
// adamw_step on each of count tensors, as one parallel pass over all their elements: the same bits.
void adamw_step_many(const AdamWTensor* ts, int64_t count, double lr, double beta1, double beta2, double eps,
                     double weight_decay, int64_t step);
void sgd_step(float* p, const float* g, float* buf, bf16* work, int64_t n, double lr, double momentum,
              double weight_decay, bool first_step);

}  // namespace relay::cpu
