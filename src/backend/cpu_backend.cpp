// CPU backend: shape checks, then the kernels in kernels/cpu.
#include "backend/cpu_backend.hpp"

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay {

namespace {
void same_shape(const Tensor& a, const Tensor& b, const char* what) {
  RELAY_ASSERT(a.shape() == b.shape(), what << ": " << shape_str(a.shape()) << " vs " << shape_str(b.shape()));
}
int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(0); }
int64_t cols_of(const Tensor& t) { return t.ndim() <= 1 ? 1 : t.numel() / t.size(0); }
}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(threads < 1 ? 1 : threads) { cpu::set_threads(threads_); }

std::string CpuBackend::describe() const { return cat("cpu (oneDNN sgemm, ", threads_, " thread", threads_ > 1 ? "s" : "", ")"); }

void CpuBackend::set_precision(Precision p) {
  if (p != Precision::fp32)
    throw Error("train.precision = \"bf16\" is only supported with train.device = \"cuda\"; the CPU backend runs fp32");
}

std::shared_ptr<std::byte> CpuBackend::allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(cat("out of host memory allocating ", bytes, " bytes"));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

void CpuBackend::upload(Tensor& dst, const void* host_src) { std::memcpy(dst.raw(), host_src, dst.bytes()); }
void CpuBackend::download(void* host_dst, const Tensor& src) { std::memcpy(host_dst, src.raw(), src.bytes()); }
void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  RELAY_ASSERT(dst.numel() == src.numel() && dst.dtype() == src.dtype(), "copy size mismatch");
  if (dst.raw() != src.raw()) std::memcpy(dst.raw(), src.raw(), src.bytes());
}
void CpuBackend::fill(Tensor& x, float value) { cpu::fill(x.f32(), value, x.numel()); }

void CpuBackend::matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                        float beta) {
  RELAY_ASSERT(a.ndim() == 2 && b.ndim() == 2 && y.ndim() == 2, "matmul needs 2-d tensors");
  int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  RELAY_ASSERT(k == kb && y.size(0) == m && y.size(1) == n,
               "matmul shapes " << shape_str(a.shape()) << (trans_a ? "^T" : "") << " @ " << shape_str(b.shape())
                                << (trans_b ? "^T" : "") << " -> " << shape_str(y.shape()));
  cpu::gemm(trans_a, trans_b, m, n, k, alpha, a.f32(), a.size(1), b.f32(), b.size(1), beta, y.f32(), y.size(1));
}

void CpuBackend::add_bias(Tensor& y, const Tensor& bias) {
  RELAY_ASSERT(bias.numel() == cols_of(y), "bias " << shape_str(bias.shape()) << " for " << shape_str(y.shape()));
  cpu::add_bias(y.f32(), bias.f32(), rows_of(y), cols_of(y));
}
void CpuBackend::bias_grad(const Tensor& dy, Tensor& db, float beta) {
  RELAY_ASSERT(db.numel() == cols_of(dy), "bias grad " << shape_str(db.shape()) << " for " << shape_str(dy.shape()));
  cpu::bias_grad(dy.f32(), db.f32(), rows_of(dy), cols_of(dy), beta);
}

void CpuBackend::activation_forward(Activation act, const Tensor& x, Tensor& y) {
  same_shape(x, y, "activation_forward");
  switch (act) {
    case Activation::relu: cpu::relu_forward(x.f32(), y.f32(), x.numel()); break;
    case Activation::gelu: cpu::gelu_forward(x.f32(), y.f32(), x.numel()); break;
    case Activation::tanh: cpu::tanh_forward(x.f32(), y.f32(), x.numel()); break;
    case Activation::gelu_tanh: cpu::gelu_tanh_forward(x.f32(), y.f32(), x.numel()); break;
  }
}
void CpuBackend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
  same_shape(x, dy, "activation_backward");
  same_shape(x, dx, "activation_backward");
  switch (act) {
    case Activation::relu: cpu::relu_backward(x.f32(), dy.f32(), dx.f32(), x.numel()); break;
    case Activation::gelu: cpu::gelu_backward(x.f32(), dy.f32(), dx.f32(), x.numel()); break;
    case Activation::tanh: cpu::tanh_backward(x.f32(), dy.f32(), dx.f32(), x.numel()); break;
    case Activation::gelu_tanh: cpu::gelu_tanh_backward(x.f32(), dy.f32(), dx.f32(), x.numel()); break;
  }
}
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  same_shape(a, b, "add");
  same_shape(a, y, "add");
  cpu::add(a.f32(), b.f32(), y.f32(), a.numel());
}
void CpuBackend::scale(Tensor& x, float s) { cpu::scale(x.f32(), s, x.numel()); }
double CpuBackend::sum_squares(const Tensor& x) { return cpu::sum_squares(x.f32(), x.numel()); }

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                   Tensor& mean, Tensor& rstd) {
  same_shape(x, y, "layernorm_forward");
  RELAY_ASSERT(gamma.numel() == cols_of(x) && beta.numel() == cols_of(x) && mean.numel() == rows_of(x) &&
                   rstd.numel() == rows_of(x),
               "layernorm shapes for " << shape_str(x.shape()));
  cpu::layernorm_forward(x.f32(), gamma.f32(), beta.f32(), eps, y.f32(), mean.f32(), rstd.f32(), rows_of(x),
                         cols_of(x));
}
void CpuBackend::layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, Tensor& dx) {
  same_shape(x, dy, "layernorm_backward_input");
  same_shape(x, dx, "layernorm_backward_input");
  cpu::layernorm_backward_input(dy.f32(), x.f32(), gamma.f32(), mean.f32(), rstd.f32(), dx.f32(), rows_of(x),
                                cols_of(x));
}
void CpuBackend::layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                           Tensor& dgamma, Tensor& dbeta) {
  same_shape(x, dy, "layernorm_backward_weight");
  cpu::layernorm_backward_weight(dy.f32(), x.f32(), mean.f32(), rstd.f32(), dgamma.f32(), dbeta.f32(), rows_of(x),
                                 cols_of(x));
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                               Tensor* dlogits) {
  RELAY_ASSERT(targets.numel() == rows_of(logits) && losses.numel() == rows_of(logits), "cross_entropy shapes");
  if (dlogits) same_shape(logits, *dlogits, "cross_entropy dlogits");
  cpu::cross_entropy(logits.f32(), targets.i32(), grad_scale, losses.f32(), dlogits ? dlogits->f32() : nullptr,
                     rows_of(logits), cols_of(logits));
}
void CpuBackend::mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred) {
  same_shape(pred, target, "mse");
  RELAY_ASSERT(losses.numel() == rows_of(pred), "mse losses");
  cpu::mse(pred.f32(), target.f32(), grad_scale, losses.f32(), dpred ? dpred->f32() : nullptr, rows_of(pred),
           cols_of(pred));
}
void CpuBackend::argmax(const Tensor& logits, Tensor& out) {
  RELAY_ASSERT(out.numel() == rows_of(logits), "argmax out");
  cpu::argmax(logits.f32(), out.i32(), rows_of(logits), cols_of(logits));
}

void CpuBackend::row_max(const Tensor& x, Tensor& out) {
  RELAY_ASSERT(out.numel() == rows_of(x), "row_max out");
  cpu::row_max(x.f32(), out.f32(), rows_of(x), cols_of(x));
}
void CpuBackend::cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                       const Tensor& row_max, Tensor& partial) {
  const int64_t n = rows_of(logits);
  RELAY_ASSERT(targets.numel() == n && row_max.numel() == n && partial.numel() == 2 * n, "cross_entropy_partial shapes");
  cpu::cross_entropy_partial(logits.f32(), targets.i32(), vocab_start, row_max.f32(), partial.f32(), n, cols_of(logits));
}
void CpuBackend::cross_entropy_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                      const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                      Tensor* dlogits) {
  const int64_t n = rows_of(logits);
  RELAY_ASSERT(targets.numel() == n && row_max.numel() == n && total.numel() == 2 * n && losses.numel() == n,
               "cross_entropy_finish shapes");
  if (dlogits) same_shape(logits, *dlogits, "cross_entropy_finish dlogits");
  cpu::cross_entropy_finish(logits.f32(), targets.i32(), vocab_start, row_max.f32(), total.f32(), grad_scale,
                            losses.f32(), dlogits ? dlogits->f32() : nullptr, n, cols_of(logits));
}

void CpuBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T,
                                   Tensor& out, int64_t vocab_start) {
  const int64_t n = tokens.numel(), C = wte.size(1);
  RELAY_ASSERT(tokens.dtype() == DType::i32 && out.numel() == n * C &&
                   (!wpe.defined() || (wpe.size(1) == C && T <= wpe.size(0))),
               "embedding_forward shapes: tokens " << shape_str(tokens.shape()) << ", wte " << shape_str(wte.shape())
                                                   << ", wpe " << (wpe.defined() ? shape_str(wpe.shape()) : "none")
                                                   << ", T " << T);
  cpu::embedding_forward(tokens.i32(), wte.f32(), wpe.defined() ? wpe.f32() : nullptr, out.f32(), n, C, T,
                         vocab_start, wte.size(0));
}
void CpuBackend::embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                                    int64_t vocab_start) {
  const int64_t n = tokens.numel(), C = dwte.size(1);
  RELAY_ASSERT(dout.numel() == n * C && (!dwpe.defined() || (dwpe.size(1) == C && T <= dwpe.size(0))),
               "embedding_backward shapes");
  cpu::embedding_backward(tokens.i32(), dout.f32(), dwte.f32(), dwpe.defined() ? dwpe.f32() : nullptr, n, C, T,
                          vocab_start, dwte.size(0));
}
void CpuBackend::attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out) {
  const int64_t C = qkv.size(1) / 3;
  RELAY_ASSERT(qkv.numel() == B * T * 3 * C && att.numel() == B * H * T * T && out.numel() == B * T * C && C % H == 0,
               "attention_forward shapes: qkv " << shape_str(qkv.shape()) << ", B " << B << ", T " << T << ", H " << H);
  cpu::attention_forward(qkv.f32(), att.f32(), out.f32(), B, T, C, H);
}
void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                                    int64_t H, Tensor& dqkv) {
  const int64_t C = qkv.size(1) / 3;
  same_shape(qkv, dqkv, "attention_backward");
  RELAY_ASSERT(dout.numel() == B * T * C && att.numel() == B * H * T * T, "attention_backward shapes");
  cpu::attention_backward(dout.f32(), qkv.f32(), att.f32(), dqkv.f32(), B, T, C, H);
}
void CpuBackend::attention_decode(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                                  Tensor& out) {
  const int64_t n = qkv.size(0), C = qkv.size(1) / 3, Tmax = kcache.size(1);
  RELAY_ASSERT(kcache.shape() == vcache.shape() && kcache.size(0) == n && kcache.size(2) == C && t < Tmax &&
                   out.numel() == n * C,
               "attention_decode shapes: qkv " << shape_str(qkv.shape()) << ", cache " << shape_str(kcache.shape())
                                               << ", t " << t);
  cpu::attention_decode(qkv.f32(), kcache.f32(), vcache.f32(), out.f32(), n, t, Tmax, C, H);
}

void CpuBackend::adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                            const AdamWArgs& a) {
  same_shape(param, grad, "adamw grad");
  cpu::adamw_step(param.f32(), grad.f32(), exp_avg.f32(), exp_avg_sq.f32(), param.numel(), a.lr, a.beta1, a.beta2,
                  a.eps, a.weight_decay, a.step);
}
void CpuBackend::sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdArgs& a) {
  same_shape(param, grad, "sgd grad");
  cpu::sgd_step(param.f32(), grad.f32(), a.momentum != 0.0 ? buf.f32() : nullptr, param.numel(), a.lr, a.momentum,
                a.weight_decay, a.first_step);
}

}  // namespace relay
