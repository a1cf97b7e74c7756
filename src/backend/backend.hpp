// The one interface between the model and the hardware (ggml's backend pattern): every operation
// the layers, losses and optimizers need. The CPU backend is the reference; CUDA is tested against it.
// All float tensors are float32 row-major; "rows" is the batch dimension.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.hpp"

namespace relay {

// gelu is the exact erf form, as torch.nn.GELU(); gelu_tanh is GPT-2's tanh approximation,
// torch.nn.GELU(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class Activation { relu, gelu, tanh, gelu_tanh };
enum class Precision { fp32, bf16 };          // bf16: GEMM inputs in bfloat16, fp32 accumulation

// Hyperparameters stay double, as torch's Python scalars do; kernels derive their float constants
// (1 - beta2, lr / bias correction, ...) in double first, so they round exactly as torch's do.
struct AdamWArgs {  // torch.optim.AdamW
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1 on the first update (bias correction)
};
struct SgdArgs {  // torch.optim.SGD, dampening 0, nesterov false
  double lr, momentum, weight_decay;
  bool first_step;  // the momentum buffer is initialised to the first gradient, as torch does
};

namespace detail {
struct HostMarks;  // the host clock's timing marks (backend.cpp)
}

class Backend : public Allocator {
 public:
  Backend();
  ~Backend() override;
  virtual std::string describe() const = 0;  // "cpu: oneDNN, 2 threads" / "cuda:0 NVIDIA H100 ..."
  virtual void set_precision(Precision p) = 0;

  // --- memory -------------------------------------------------------------------------------
  // Host memory suited to transfers (pinned on CUDA, plain on CPU).
  virtual std::shared_ptr<std::byte> allocate_host(size_t bytes) = 0;
  virtual void upload(Tensor& dst, const void* host_src) = 0;      // dst.bytes() bytes
  virtual void download(void* host_dst, const Tensor& src) = 0;    // src.bytes() bytes; synchronous
  virtual void copy(Tensor& dst, const Tensor& src) = 0;           // same shape and dtype
  virtual void fill(Tensor& x, float value) = 0;
  virtual void synchronize() = 0;
  virtual void* native_stream() { return nullptr; }                // cudaStream_t on CUDA

  // --- timing for traces ------------------------------------------------------------------------
  // A mark at this point of the backend's execution order: the host clock on the CPU, a CUDA event
  // on the GPU (so spans measure the GPU's work, not the host's asynchronous launches).
  // mark_seconds(mark) is its time since this backend's first mark, valid once the work queued
  // before it has run (after synchronize()). clear_marks() drops them all (the first mark restarts).
  virtual int64_t timing_mark();
  virtual double mark_seconds(int64_t mark);
  virtual void clear_marks();

  // --- linear algebra -------------------------------------------------------------------------
  // y (m, n) = alpha * op(a) @ op(b) + beta * y, where op(a) is (m, k) and op(b) is (k, n).
  virtual void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y,
                      float alpha, float beta) = 0;
  // y (n, f) += bias (f), broadcast over rows.
  virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
  // db (f) = beta * db + sum over rows of dy (n, f).
  virtual void bias_grad(const Tensor& dy, Tensor& db, float beta) = 0;

  // --- elementwise ----------------------------------------------------------------------------
  virtual void activation_forward(Activation act, const Tensor& x, Tensor& y) = 0;
  // dx = dy * act'(x); dx may alias dy.
  virtual void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void scale(Tensor& x, float s) = 0;
  // y = a + b (same shape); y may alias a or b (residual connections and their gradients).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  // Sum of squares of all elements, returned to the host (gradient norms).
  virtual double sum_squares(const Tensor& x) = 0;

  // --- layernorm over the last dimension (torch.nn.LayerNorm) ---------------------------------
  // x, y (n, d); gamma, beta (d); mean, rstd (n) are saved for the backward pass.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                 Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                        const Tensor& mean, const Tensor& rstd, Tensor& dx) = 0;
  // dgamma += sum over rows of dy * xhat; dbeta += sum over rows of dy.
  virtual void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                         const Tensor& rstd, Tensor& dgamma, Tensor& dbeta) = 0;

  // --- losses ---------------------------------------------------------------------------------
  // logits (n, c), targets i32 (n) -> losses (n) = -log softmax(logits)[target];
  // if dlogits: dlogits (n, c) = (softmax - onehot) * grad_scale. dlogits may alias logits (the
  // vocabulary-sized loss of a language model never stores more than its logits).
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale,
                             Tensor& losses, Tensor* dlogits) = 0;
  // pred, target (n, k) -> losses (n) = mean over k of (pred - target)^2;
  // if dpred: dpred (n, k) = 2 (pred - target) / k * grad_scale.
  virtual void mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses,
                   Tensor* dpred) = 0;
  // out i32 (n) = argmax over columns of logits (n, c), first maximum wins.
  virtual void argmax(const Tensor& logits, Tensor& out) = 0;
  // Vocabulary-parallel cross-entropy (Megatron-LM): logits (n, v) are columns [vocab_start,
  // vocab_start + v) of the full (n, V); the group never gathers them. The caller reduces between steps:
  //   row_max: out (n) = max over columns                                  -> all-reduce max over tp
  //   cross_entropy_partial: partial (n, 2) = [sum_c exp(logit - max), logit[target] or 0 when the
  //     target is another rank's]                                          -> all-reduce sum over tp
  //   cross_entropy_finish: losses (n) = log(sum) + max - logit[target]; if dlogits (may alias logits):
  //     (exp(logit - lse) - onehot) * grad_scale over this rank's columns.
  virtual void row_max(const Tensor& x, Tensor& out) = 0;
  virtual void cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                     const Tensor& row_max, Tensor& partial) = 0;
  virtual void cross_entropy_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                    Tensor* dlogits) = 0;

  // --- language models (GPT-2) -----------------------------------------------------------------
  // tokens i32 (n) with n = sequences x T, position of row r = r % T;
  // out (n, C) = wte[tokens[r]] + wpe[r % T]; wte (V, C), wpe (block_size, C), T <= block_size.
  // Every token id must be in [0, V) (checked when data is read, not here).
  // Vocabulary-parallel (tensor parallelism): wte holds rows [vocab_start, vocab_start + wte.size(0)) of
  // the table and other tokens contribute 0; an undefined wpe adds no positions.
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T,
                                 Tensor& out, int64_t vocab_start = 0) = 0;
  // dwte (V, C) += scatter of dout (n, C) by token; dwpe (block_size, C) += sum over sequences of dout.
  // Deterministic: the same inputs give the same bits on every run and thread count (no atomics).
  // Vocabulary-parallel as above; an undefined dwpe is skipped.
  virtual void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte,
                                  Tensor& dwpe, int64_t vocab_start = 0) = 0;
  // Causal multi-head self-attention of GPT-2 over n = B x T rows.
  // qkv (B*T, 3C): row = [q | k | v], head h uses columns [h*hd, (h+1)*hd) of each part, hd = C / H.
  // att (B, H, T, T): the softmax probabilities (saved for backward; entries above the diagonal are 0).
  // out (B*T, C): heads concatenated, out[b,t,h] = sum_{s<=t} att[b,h,t,s] v[b,s,h]; scale 1/sqrt(hd).
  virtual void attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) = 0;
  // dout (B*T, C), qkv and att from forward -> dqkv (B*T, 3C) (overwritten, not accumulated).
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                                  int64_t H, Tensor& dqkv) = 0;
  // Generation with a key-value cache, one new position t for each of n sequences:
  // qkv (n, 3C) of position t; kcache, vcache (n, Tmax, C): row t of each is overwritten with this k, v,
  // then out (n, C) = causal attention of q over cached positions [0, t].
  virtual void attention_decode(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                                Tensor& out) = 0;

  // --- optimizers (exact torch.optim update rules) --------------------------------------------
  virtual void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                          const AdamWArgs& args) = 0;
  // momentum_buffer is undefined when momentum == 0.
  virtual void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args) = 0;

 private:
  std::unique_ptr<detail::HostMarks> host_marks_;
};

struct BackendOptions {
  Device device = Device::cpu;
  int threads = 1;        // CPU threads for this rank
  int gpu = 0;            // CUDA device index (local rank mod visible GPUs)
  Precision precision = Precision::fp32;
};

// Makes the backend for the options; a clear relay::Error when the device is not available
// (train.device = "cuda" in a build without CUDA, or on a machine without a GPU).
std::unique_ptr<Backend> make_backend(const BackendOptions& opts);
// Number of usable CUDA devices (0 in a CPU-only build or without a GPU).
int cuda_device_count();

}  // namespace relay
