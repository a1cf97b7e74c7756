// CPU reference kernels on raw row-major float32 buffers. GEMMs go to oneDNN (the library PyTorch
// uses on CPU); the rest are OpenMP loops whose reduction order does not depend on the thread count,
// so one layout gives bitwise-identical results run after run.
#pragma once
#include <cstdint>

namespace relay::cpu {

void set_threads(int threads);
int threads();

// c (m, n) = alpha * op(a) @ op(b) + beta * c; op(a) (m, k), op(b) (k, n); lda/ldb/ldc are row strides.
// f32 only; bf16 inputs or outputs and a fused bias: cpu::matmul (kernels/cpu/matmul.hpp).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);                  // y (rows, cols) += bias (cols)
void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, float beta);      // db = beta db + colsum(dy)
void relu_forward(const float* x, float* y, int64_t n);
void relu_backward(const float* x, const float* dy, float* dx, int64_t n);
void gelu_forward(const float* x, float* y, int64_t n);                                  // exact erf form
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
void gelu_tanh_forward(const float* x, float* y, int64_t n);                             // GPT-2's tanh form
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n);
void add(const float* a, const float* b, float* y, int64_t n);                            // y may alias a or b
void tanh_forward(const float* x, float* y, int64_t n);
void tanh_backward(const float* x, const float* dy, float* dx, int64_t n);
void scale(float* x, float s, int64_t n);
void fill(float* x, float v, int64_t n);
double sum_squares(const float* x, int64_t n);

// LayerNorm over rows of x (rows, d), biased variance as torch.nn.LayerNorm.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t d);
void layernorm_backward_input(const float* dy, const float* x, const float* gamma, const float* mean,
                              const float* rstd, float* dx, int64_t rows, int64_t d);
void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd, float* dgamma,
                               float* dbeta, int64_t rows, int64_t d);

// Softmax cross-entropy; dlogits may be null. Targets must be in [0, classes).
void cross_entropy(const float* logits, const int32_t* targets, float grad_scale, float* losses, float* dlogits,
                   int64_t rows, int64_t classes);
void mse(const float* pred, const float* target, float grad_scale, float* losses, float* dpred, int64_t rows,
         int64_t k);
void argmax(const float* logits, int32_t* out, int64_t rows, int64_t classes);
// Vocabulary-parallel cross-entropy (Megatron-LM), see Backend::cross_entropy_partial.
void row_max(const float* x, float* out, int64_t rows, int64_t cols);
void cross_entropy_partial(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                           float* partial, int64_t rows, int64_t cols);
void cross_entropy_finish(const float* logits, const int32_t* targets, int64_t vocab_start, const float* row_max,
                          const float* total, float grad_scale, float* losses, float* dlogits, int64_t rows,
                          int64_t cols);

// GPT-2 (kernels/cpu/transformer.cpp). tokens (rows), position of row r = r % T.
// out (rows, C) = wte[tokens] + wpe[r % T]; backward: dwte, dwpe += (deterministic, no atomics).
// Vocabulary-parallel: wte holds rows [vocab_start, vocab_start + vocab_rows) of the table; other tokens
// contribute 0 (and no gradient). wpe / dwpe null: no positions.
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int64_t rows,
                       int64_t C, int64_t T, int64_t vocab_start, int64_t vocab_rows);
void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows);
// Causal self-attention: qkv (B*T, 3C) [q | k | v], att (B, H, T, T) probabilities, out (B*T, C).
void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H);
// dqkv (B*T, 3C) is overwritten.
void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, int64_t B, int64_t T,
                        int64_t C, int64_t H);
// One position t of n sequences: qkv (n, 3C); caches (n, Tmax, C), row t written; out (n, C).
void attention_decode(const float* qkv, float* kcache, float* vcache, float* out, int64_t n, int64_t t, int64_t Tmax,
                      int64_t C, int64_t H);

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1, double beta2,
                double eps, double weight_decay, int64_t step);
void sgd_step(float* p, const float* g, float* buf, int64_t n, double lr, double momentum, double weight_decay,
              bool first_step);

}  // namespace relay::cpu
