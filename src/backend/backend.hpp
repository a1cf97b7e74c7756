// The one interface between the model and the hardware (ggml's backend pattern): every operation
// the layers, losses and optimizers need. The CPU backend is the reference; CUDA is tested against it.
// Tensors are row-major; "rows" is the leading dimension (a vector is one column).
//
// Check once (ggml's backend front door): every public op is a non-virtual member that checks its
// tensors' devices, dtypes and shapes, naming the op and the tensor, then calls the backend's *_impl,
// which only computes. Each op's comment states the dtypes it takes: "float" means float32 or
// bfloat16 (math in float32 either way); tensors named together must share one dtype.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>
#include <string>

#include "core/fp8_scaling.hpp"
#include "core/precision.hpp"
#include "core/tensor.hpp"
#include "kernels/rope_angles.hpp"

namespace relay {

// gelu is the exact erf form, as torch.nn.GELU(); gelu_tanh is GPT-2's tanh approximation,
// torch.nn.GELU(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class Activation { relu, gelu, tanh, gelu_tanh };
// What Backend::linear applies after its bias: nothing, or GPT-2's tanh GELU (Activation::gelu_tanh).
enum class LinearAct { none, gelu_tanh };
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
  // Bytes this device could still allocate: the host's MemAvailable (shared by the node's ranks), or the GPU's free
  // memory (shared by the ranks on it).
  virtual int64_t available_bytes() const = 0;
  // Chooses the GEMM mode (tf32 on CUDA) and checks the device can run the precision; a relay::Error
  // naming train.precision when it cannot.
  virtual void set_precision(Precision p) = 0;
  // Whether this backend computes on dtype dt (bf16 needs its kernels); the front door refuses others.
  virtual bool supports(DType dt) const = 0;

  // --- memory -------------------------------------------------------------------------------
  // Host memory suited to transfers (pinned on CUDA, plain on CPU).
  virtual std::shared_ptr<std::byte> allocate_host(size_t bytes) = 0;
  virtual void upload(Tensor& dst, const void* host_src) = 0;      // dst.bytes() bytes
  virtual void download(void* host_dst, const Tensor& src) = 0;    // src.bytes() bytes; synchronous
  // dst.numel() floats from the host into a float tensor of either dtype (rounded to bf16: on the host by default,
  // on the device where the backend overrides upload_f32_impl).
  void upload_f32(Tensor& dst, const float* host_src);
  void copy(Tensor& dst, const Tensor& src);                       // any dtype; same numel and dtype
  // dst (n, w) row i = src (m, w) row index[i]; index i32 (n), every entry in [0, m); float, one dtype; dst must not
  // alias src. (Context parallelism: gathered keys from rank order into sequence order, and back.)
  void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst);
  // Columns [dst_col, dst_col + width) of every row of dst (n, dw) = columns [src_col, src_col + width) of src (n, sw);
  // float, one dtype; the rest of dst untouched. (GPT's packed q | k | v, in and out of separate tensors.)
  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width);
  void fill(Tensor& x, float value);                               // float or i32
  // dst = src rounded to dst's dtype (float -> float: f32 <-> bf16, or a copy); same numel.
  void convert(const Tensor& src, Tensor& dst);
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
  // Called by every op's front door around the op (outermost op only when ops nest): the CUDA backend times
  // each op with events when RELAY_OP_PROFILE=1 and prints the GPU time by op when it is destroyed.
  virtual void op_begin(const char* /*op*/) const {}
  virtual void op_end() const {}
  // Drops what the op profile has counted so far (the trainer calls it before its second step, so that the
  // first step's one-time costs, lazy kernel loading and allocations, stay out of the profile).
  virtual void op_profile_restart() {}

  // --- linear algebra -------------------------------------------------------------------------
  // y (m, n) = alpha * op(a) @ op(b) + beta * y, where op(a) is (m, k) and op(b) is (k, n).
  // a, b: float, one dtype; y: float (f32 when a, b are f32). Accumulation in f32; y must not alias a or b.
  void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha, float beta);
  // y (n, f) += bias (f), broadcast over rows. y, bias: float, one dtype.
  void add_bias(Tensor& y, const Tensor& bias);
  // db (f) = beta * db + sum over rows of dy (n, f). dy: float; db: f32.
  void bias_grad(const Tensor& dy, Tensor& db, float beta);
  // A fused linear layer: y (n, out) = act(x (n, in) @ w (out, in)^T + bias (out)), one GEMM with the
  // bias (and GELU) in its epilogue where the backend has one (cuBLASLt, oneDNN). bias may be undefined
  // (no bias). With act = gelu_tanh, *pre_act (n, out) receives x @ w^T + bias, the GELU's input that
  // its backward needs; pre_act may be null (inference). x, w, bias, y, pre_act: float, one dtype; y and
  // pre_act must not alias x, w or each other. Equals matmul + add_bias + activation_forward (f32: the
  // same bits on the CPU; bf16: the bias is added before the single rounding, so within one bf16 ulp).
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act = LinearAct::none,
              Tensor* pre_act = nullptr);
  // The input gradient of a linear layer whose input came out of an activation, fused:
  // dx (n, in) = act'(act_in) * (dy (n, out) @ w (out, in)), act_in (n, in) being that activation's input
  // (the pre_act a forward linear saved); act none gives dx = dy @ w (act_in unused, may be undefined).
  // dy, w, act_in, dx: float, one dtype; dx must not alias dy, w or act_in. Equals matmul +
  // activation_backward (the same bits on the CPU).
  void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act, const Tensor& act_in);

  // --- grouped GEMMs: a MoE layer's experts in one pass where the backend allows (model/moe.cpp) ---------
  // Row groups: group g is rows [offsets[g], offsets[g + 1]) of a and y (offsets on the host, G + 1 ascending entries,
  // offsets[G] <= the rows of a and y); a group with no rows is skipped.
  // y_g (m_g, n) = a_g (m_g, k) @ op(b[g]) + beta * y_g, op(b) = b^T for b (n, k) when trans_b, else b (k, n).
  // a, every b[g], y: float, one dtype; y must not alias a or any b[g].
  void grouped_matmul(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                      const std::vector<int64_t>& offsets, float beta);
  // The weight gradients over the same row groups: dw[g] (n, k) = dy_g^T (n, m_g) @ x_g (m_g, k) + beta * dw[g]
  // (beta * dw[g] for a group with no rows). dy, x: float, one dtype; every dw[g]: float (f32 when dy is f32),
  // aliasing neither.
  void grouped_matmul_weight(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                             const std::vector<Tensor>& dw, float beta);

  // --- FP8: core/fp8.hpp's formats, core/fp8_scaling.hpp's recipes; the CPU's emulation is the reference ---------
  // q (rows, cols) = x (rows, cols) / its tile's scale, rounded to q's format (fp8_e4m3 or fp8_e5m2) to nearest even
  // and saturated; scales (grid rows, grid cols) f32, fp8_grid(tiling, rows, cols)'s layout, = each tile's amax / max
  // finite (1 for an all-zero tile, and for one holding an inf or NaN, which stays non-finite in q). x: float.
  void fp8_quantize(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales);
  // fp8_quantize's two passes one at a time, so that the ranks holding shards of one tensor can agree on its amax in
  // between (a max all-reduce: exact on integers) and still read their shard only once for each pass:
  // amax (grid rows, grid cols) i32 = each tile's max |x| as the bits of the float (core/fp8_scaling.hpp's
  // fp8_abs_bits: non-negative, ordered as the values, NaN above inf); x: float.
  void fp8_amax(const Tensor& x, Fp8Tiling tiling, Tensor& amax);
  // scales = fp8_scale(amax) for q's format and q = x / its tile's scale, from given amax (fp8_amax's layout, e.g.
  // the max over the group of the shards'). fp8_amax then fp8_quantize_amax is fp8_quantize, bit for bit.
  void fp8_quantize_amax(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q, Tensor& scales);
  // y (m, n) = op(a) @ op(b) + beta * y from quantised operands, op(a) (m, k), op(b) (k, n): a, b fp8 (either format),
  // a_scales, b_scales f32 as fp8_quantize made them with a_tiling, b_tiling. Products exact, sums in f32; the scales
  // multiply each k block's partial sum (fp8_k_block: the whole k tensorwise, 128 blockwise; the two operands' tilings
  // must agree on it; kernels/cpu/fp8_gemm.hpp). y: float; beta 0 does not read y; y must not alias a or b.
  void fp8_matmul(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a, const Tensor& b,
                  const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y, float beta);

  // --- elementwise (float, one dtype) ----------------------------------------------------------
  void activation_forward(Activation act, const Tensor& x, Tensor& y);
  // dx = dy * act'(x); dx may alias dy.
  void activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx);
  void scale(Tensor& x, float s);
  // y = a + b (same shape); y may alias a or b (residual connections and their gradients).
  void add(const Tensor& a, const Tensor& b, Tensor& y);
  // Sum of squares of all elements in double, returned to the host (gradient norms). x: f32.
  double sum_squares(const Tensor& x);

  // --- layernorm over the last dimension (torch.nn.LayerNorm) ---------------------------------
  // x, y, dy, dx, gamma, beta (d): float, one dtype; mean, rstd (n): f32, saved for the
  // backward pass; dgamma, dbeta (d): f32.
  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                         Tensor& mean, Tensor& rstd);
  void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, Tensor& dx);
  // dgamma += sum over rows of dy * xhat; dbeta += sum over rows of dy.
  void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                 Tensor& dgamma, Tensor& dbeta);

  // --- RMSNorm over the last dimension (transformers' LlamaRMSNorm, torch.nn.RMSNorm) -----------
  // y (n, d) = x * rstd * gamma, rstd (n) = 1 / sqrt(mean over d of x^2 + eps), f32, saved for the
  // backward. x, y, dy, dx, gamma (d): float, one dtype; rstd: f32; dgamma (d): f32 (accumulated).
  void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd);
  void rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx);
  // dgamma += sum over rows of dy * x * rstd. Deterministic (fixed reduction order, no atomics).
  void rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dgamma);
  // --- SwiGLU (Llama's MLP): h (n, f) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Float, one dtype.
  void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& h);
  // dgate = dh * up * silu'(gate), dup = dh * silu(gate); elementwise: dgate and dup may alias dh, gate or up.
  void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);
  // --- Mixture of experts (Mixtral, Qwen3-MoE: model/moe.hpp) --------------------------------------
  // The router of n tokens over E experts, as transformers' TopKRouter: probs (n, E) f32 = softmax of logits
  // (n, E) in f32, lse (n) f32 its log-sum-exp (the z-loss's term), experts i32 (n, k) the k largest
  // probabilities' experts in descending order (the lower expert first on a tie), weights (n, k) f32 their
  // probabilities, divided by their sum when renormalize. logits: float. bias (E) f32, optional (aux-loss-free
  // balancing): the experts are the k largest of probs + bias; the weights stay the probabilities.
  void moe_router_forward(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse,
                          Tensor& experts, Tensor& weights, const Tensor& bias = Tensor());
  // dlogits (n, E) (float, logits' dtype) = the gradient through the softmax of
  //   the top-k weights' gradient dweights (n, k) f32 (through the renormalisation when renormalize),
  //   + seq_grad[s, e] (f32 (n / T, E), may be undefined) on every probability p[t, e] of sequence s = t / T
  //     (the per-sequence load-balancing loss: d loss / d p[t, e] is constant over a sequence's tokens),
  //   + z_scale * 2 * lse[t] on lse[t] (the z-loss z_scale * lse^2).
  // probs, lse, experts as moe_router_forward wrote them. Overwrites dlogits.
  void moe_router_backward(const Tensor& probs, const Tensor& lse, const Tensor& experts, const Tensor& dweights,
                           bool renormalize, const Tensor& seq_grad, int64_t T, float z_scale, Tensor& dlogits);
  // DeepSeek-V3's router (transformers' DeepseekV3TopkRouter; arXiv:2412.19437 section 2.1.2), the MoE layers with
  // MoeSpec::score = sigmoid: probs (n, E) f32 = sigmoid of logits (n, E) in f32; the choice scores probs + bias
  // (bias (E) f32, optional: e_score_correction_bias, the choice only); the E experts in n_group groups of E / n_group,
  // each group ranked by the sum of its two best choice scores (its one score when a group holds one expert), the
  // topk_group best kept (the lower group first on a tie); experts i32 (n, k) the k best choice scores of the kept
  // groups' experts, descending (the lower expert first on a tie); weights (n, k) f32 = their probs, divided by their
  // sum + 1e-20 when renormalize, times scale (routed_scaling_factor). logits: float.
  struct GroupRouting {
    int64_t k = 1, n_group = 1, topk_group = 1;
    bool renormalize = true;
    float scale = 1.f;
  };
  void moe_group_router_forward(const Tensor& logits, const GroupRouting& r, Tensor& probs, Tensor& experts,
                                Tensor& weights, const Tensor& bias = Tensor());
  // dlogits (n, E) (float, probs' shape, logits' dtype) = the gradient through the sigmoid of
  //   the weights' gradient dweights (n, k) f32 (through the scale and the renormalisation; none through the choice),
  //   + seq_grad[s, e] (f32 (n / T, E), may be undefined) on every normalised score q[t, e] = p[t, e] / (sum_i p[t, i]
  //     + 1e-20) of sequence s = t / T (DeepSeek-V3's complementary sequence-wise loss averages q, not p).
  // probs, experts as moe_group_router_forward wrote them. Overwrites dlogits.
  void moe_group_router_backward(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                 const GroupRouting& r, const Tensor& seq_grad, int64_t T, Tensor& dlogits);
  // y (n, C) = sum over j < k of weights[t, j] * rows[pos[t, j]] (rows (R, C), pos i32 (n, k) in [0, R)), summed in
  // j order; weights undefined: 1 (an expert input's gradient back to its token). rows, y: float, one dtype;
  // weights f32. y must not alias rows.
  void moe_combine(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y);
  // The combine's backward: drows[pos[t, j]] = weights[t, j] * dy[t] (every row of drows is some (t, j)'s: pos is
  // a permutation of [0, R = n k)), dweights[t, j] = dy[t] . rows[pos[t, j]] (f32, summed in f32).
  void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& pos, const Tensor& weights,
                            Tensor& drows, Tensor& dweights);
  // --- Rotary position embedding as transformers' Llama applies it (rotate-half) ------------------
  // x, y (n, heads * head_dim), row r at position pos0 + r % T; for each head and i < head_dim / 2,
  // a = pos * inv_freq[i], inv_freq[i] = 1 / theta^(2i / head_dim):
  //   y[i] = x[i] cos a - x[i + hd/2] sin a;  y[i + hd/2] = x[i + hd/2] cos a + x[i] sin a.
  // inverse = true rotates by -a (the backward: dx from dy). x, y: float, one dtype; y may alias x.
  // Angles as transformers computes them (kernels/rope_angles.hpp): inv_freq in f32, a = float(pos) * inv_freq
  // in f32, cos and sin of that f32 angle in double, rounded once.
  // positions (optional, data.document_mask): i32 (n), row r at position pos0 + positions[r] (< T) instead.
  // scaling (optional, DeepSeek-V3's rope_scaling = "yarn"): YaRN's inv_freq, and cos and sin times its attention
  // factor (so inverse = true is the transpose, the backward, still). CUDA computes the same angles on the device.
  void rope(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse, Tensor& y,
            const Tensor& positions = Tensor(), const RopeScaling& scaling = RopeScaling());

  // The rotary columns of every head, regrouped (DeepSeek-V3's MLA rotates only columns [off, off + dr) of each
  // head, and transformers' rope_interleave reads them as pairs (2i, 2i + 1)): pe (n, heads * dr) against those
  // columns of x (n, heads * head_width). gather_rotary: pe = the columns, x's pair (2i, 2i + 1) going to pe's
  // (i, dr/2 + i) when interleaved (the layout rope() rotates), as they are when not. scatter_rotary: the inverse
  // (x's other columns untouched). One op instead of one copy_columns per column and head. x, pe: float, one dtype.
  void gather_rotary(const Tensor& x, int64_t head_width, int64_t off, bool interleaved, Tensor& pe);
  void scatter_rotary(const Tensor& pe, int64_t head_width, int64_t off, bool interleaved, Tensor& x);

  // --- losses (logits, pred, target and their gradients: float, one dtype; losses, row_max,
  //     partial, total: f32; targets, argmax out: i32) ----------------------------------------
  // logits (n, c), targets (n) -> losses (n) = -log softmax(logits)[target];
  // if dlogits: dlogits (n, c) = (softmax - onehot) * grad_scale. dlogits may alias logits (the
  // vocabulary-sized loss of a language model never stores more than its logits). A negative target is ignored
  // (torch's ignore_index; data.document_mask's position before a document's first token): loss 0, dlogits row 0.
  // The vocabulary-parallel pair below does the same.
  void cross_entropy(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses, Tensor* dlogits);
  // pred, target (n, k) -> losses (n) = mean over k of (pred - target)^2;
  // if dpred: dpred (n, k) = 2 (pred - target) / k * grad_scale.
  void mse(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses, Tensor* dpred);
  // out (n) = argmax over columns of logits (n, c), first maximum wins.
  void argmax(const Tensor& logits, Tensor& out);
  // Vocabulary-parallel cross-entropy (Megatron-LM): logits (n, v) are columns [vocab_start,
  // vocab_start + v) of the full (n, V); the group never gathers them. The caller reduces between steps:
  //   row_max: out (n) = max over columns                                  -> all-reduce max over tp
  //   cross_entropy_partial: partial (n, 2) = [sum_c exp(logit - max), logit[target] or 0 when the
  //     target is another rank's]                                          -> all-reduce sum over tp
  //   cross_entropy_finish: losses (n) = log(sum) + max - logit[target]; if dlogits (may alias logits):
  //     (exp(logit - lse) - onehot) * grad_scale over this rank's columns.
  void row_max(const Tensor& x, Tensor& out);
  void cross_entropy_partial(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& row_max,
                             Tensor& partial);
  void cross_entropy_finish(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& row_max,
                            const Tensor& total, float grad_scale, Tensor& losses, Tensor* dlogits);

  // --- language models ----------------------------------------------------------------------------
  // tokens i32 (n) with n = sequences x T, position of row r = r % T;
  // out (n, C) = wte[tokens[r]] + wpe[r % T]; wte (V, C), wpe (block_size, C), T <= block_size;
  // wte, wpe, out: float, one dtype. Every token id must be in [0, V) (checked when data is read).
  // Vocabulary-parallel (tensor parallelism): wte holds rows [vocab_start, vocab_start + wte.size(0)) of
  // the table and other tokens contribute 0; an undefined wpe adds no positions.
  // positions (optional, data.document_mask): i32 (n), the position of row r (< T) instead of r % T.
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T, Tensor& out,
                         int64_t vocab_start = 0, const Tensor& positions = Tensor());
  // dwte (V, C) += scatter of dout (n, C) by token; dwpe (block_size, C) += sum over sequences of dout.
  // dout: float; dwte, dwpe: f32. Deterministic: the same bits on every run and thread count (no atomics).
  // Vocabulary-parallel as above; an undefined dwpe is skipped.
  void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte, Tensor& dwpe,
                          int64_t vocab_start = 0, const Tensor& positions = Tensor());
  // Causal multi-head self-attention over n = B x T rows, the reference form (f32) that keeps the
  // probabilities: the test reference of flash attention.
  // qkv (B*T, 3C): row = [q | k | v], head h uses columns [h*hd, (h+1)*hd) of each part, hd = C / H.
  // att (B, H, T, T): the softmax probabilities (entries above the diagonal are 0).
  // out (B*T, C): heads concatenated, out[b,t,h] = sum_{s<=t} att[b,h,t,s] v[b,s,h]; scale 1/sqrt(hd).
  void attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att, Tensor& out);
  // dout (B*T, C), qkv and att from forward -> dqkv (B*T, 3C) (overwritten, not accumulated).
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T, int64_t H,
                          Tensor& dqkv);
  // The same attention without the T x T matrix (FlashAttention-2, arXiv:2307.08691): tiles of queries
  // against tiles of keys with an online softmax; only lse (B, H, T) f32, each query row's log-sum-exp
  // of its scaled scores, is kept for the backward. qkv, out, dout, dqkv: float, one dtype.
  // doc_start (optional, data.document_mask): i32 (B*T), query t of sequence b sees keys [doc_start[b*T + t], t]
  // only (its document's first position; documents contiguous: doc_start[t] <= t, non-decreasing in t). The CPU
  // skips key tiles before every query's document, and so do the CUDA kernels.
  void flash_attention_forward(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out, Tensor& lse,
                               const Tensor& doc_start = Tensor());
  void flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t B,
                                int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start = Tensor());
  // Queries at chosen positions of a longer key sequence (context parallelism: a rank's chunks of each sequence
  // against the sequence's gathered keys): q, out (B*Tq, H*hd), k, v (B*Tk, KV*hd), lse (B, H, Tq) f32; query t of
  // sequence b sits at key position q_pos[b*Tq + t] (i32, non-decreasing in t, < Tk) and sees keys
  // [doc_start[b*Tq + t] (optional), q_pos[b*Tq + t]]. The backward writes dq (B*Tq, H*hd) and dk, dv (B*Tk, KV*hd):
  // every key's gradient from these queries alone (the caller sums them over the ranks holding the other queries).
  // doc_start, like q_pos, is indexed by query row and non-decreasing in t (documents contiguous).
  void flash_attention_gqa_forward_at(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t Tq,
                                      int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV, Tensor& out, Tensor& lse,
                                      const Tensor& doc_start = Tensor());
  void flash_attention_gqa_backward_at(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, int64_t B, int64_t Tq, int64_t Tk,
                                       const Tensor& q_pos, int64_t H, int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv,
                                       const Tensor& doc_start = Tensor());
  // Two partial attentions of the same queries over disjoint key sets merged as the online softmax does (context
  // parallelism with parallel.overlap: the rank's own keys, then the others' once gathered): out (B*T, H*hd) float,
  // lse (B, H, T) f32 over set 1 are overwritten with the result over both; out2, lse2 (same shapes) over set 2.
  // lse = logaddexp(lse, lse2); out = e^(lse1 - lse) out + e^(lse2 - lse) out2. A row that sees no key of a set has
  // lse -inf there (its out row there is ignored, NaN included). CUDA: kernels/cuda/attention_merge.cu.
  void attention_merge(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B, int64_t T,
                       int64_t H);
  // Generation with a key-value cache, one new position t for each of n sequences:
  // qkv (n, 3C) of position t; kcache, vcache (n, Tmax, C): row t of each is overwritten with this k, v,
  // then out (n, C) = causal attention of q over cached positions [0, t]. Float, one dtype.
  void attention_decode(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H, Tensor& out);
  // --- Grouped-query flash attention (Llama: KV key/value heads, each shared by H / KV query heads;
  // KV == H is multi-head, KV == 1 multi-query). Causal, scale 1/sqrt(hd), hd = q.cols / H.
  // q (B*T, H*hd), k, v (B*T, KV*hd), out (B*T, H*hd) float, one dtype; lse (B, H, T) f32.
  // Query head h reads KV head h / (H / KV). Value heads may differ in width (DeepSeek-V3's MLA, hd 192 and hd_v
  // 128): v (B*T, KV*hd_v), out and dout (B*T, H*hd_v), dv like v; the scale stays 1/sqrt(hd). The _at pair
  // below takes the same, on the CPU and on CUDA (hd, hd_v <= 192 there; not yet run on a GPU).
  void flash_attention_gqa_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B, int64_t T, int64_t H,
                                   int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start = Tensor());
  // dq (B*T, H*hd), dk, dv (B*T, KV*hd): overwritten; a KV head's gradient sums its query heads' in a fixed
  // order (deterministic, the same bits every run and thread count).
  void flash_attention_gqa_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t H, int64_t KV,
                                    Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start = Tensor());
  // Generation, one new position t for each of n sequences: q (n, H*hd), k, v (n, KV*hd) of position t
  // (already rotated); kcache, vcache (n, Tmax, KV*hd): row t overwritten with k, v; then out (n, H*hd) =
  // causal attention of q over cached positions [0, t]. Float, one dtype.
  void attention_decode_gqa(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache, Tensor& vcache,
                            int64_t t, int64_t H, int64_t KV, Tensor& out);
  // Multi-head latent attention's absorbed decode (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2; model/mla_blocks.cpp),
  // one new position t for each of n sequences: multi-query attention over the compressed cache, whose key at a
  // position is its [latent | rotary key] (r + dr values) and whose value is the latent alone (its first r).
  // q (n, H*(r + dr)): each head's [q_nope @ W_UK (r) | rotated q_pe (dr)]; kv (n, r + dr): position t's
  // [c_kv | k_pe]; cache (n, Tmax, r + dr): row t overwritten with kv; then out (n, H*r) = per head h
  // sum_{s<=t} softmax_s(scale * q_h . cache[s]) cache[s][:r]. Float, one dtype.
  // CUDA: kernels/cuda/attention_decode_latent.cu (r + dr <= 1024; not yet run on a GPU).
  void attention_decode_latent(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H, float scale,
                               Tensor& out);

  // --- optimizers (exact torch.optim update rules) --------------------------------------------
  // param (the f32 master), grad and the state: f32, one shape. work: undefined, or the bf16 working
  // copy of param, written with the updated value in the same pass (mixed precision).
  void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWArgs& args,
                  Tensor& work);
  // AdamW on many tensors with one step's arguments: adamw_step on each, bit for bit, which a backend may fuse (the
  // CPU: one parallel pass over all their elements, so a mixture of experts' many small matrices use every thread).
  struct AdamWSlot {
    Tensor* param;
    const Tensor* grad;
    Tensor* exp_avg;
    Tensor* exp_avg_sq;
    Tensor* work;  // undefined tensor: no working copy
  };
  void adamw_step_many(const std::vector<AdamWSlot>& slots, const AdamWArgs& args);
  // momentum_buffer is undefined when momentum == 0.
  void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args, Tensor& work);

 protected:
  // upload_f32 into a bf16 tensor (the front door has checked dst): rounds on the host, then upload().
  virtual void upload_f32_bf16_impl(Tensor& dst, const float* host_src);
  // What each backend computes, called by the front doors above after their checks.
  virtual void copy_impl(Tensor& dst, const Tensor& src) = 0;
  virtual void gather_rows_impl(const Tensor& src, const Tensor& index, Tensor& dst) = 0;
  virtual void copy_columns_impl(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) = 0;
  virtual void flash_attention_gqa_forward_at_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                                                   int64_t Tq, int64_t Tk, const Tensor& q_pos, int64_t H, int64_t KV,
                                                   Tensor& out, Tensor& lse, const Tensor& doc_start) = 0;
  virtual void flash_attention_gqa_backward_at_impl(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                    const Tensor& v, const Tensor& out, const Tensor& lse, int64_t B,
                                                    int64_t Tq, int64_t Tk, const Tensor& q_pos, int64_t H,
                                                    int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv,
                                                    const Tensor& doc_start) = 0;
  virtual void attention_merge_impl(Tensor& out, Tensor& lse, const Tensor& out2, const Tensor& lse2, int64_t B,
                                    int64_t T, int64_t H) = 0;
  virtual void fill_impl(Tensor& x, float value) = 0;
  virtual void convert_impl(const Tensor& src, Tensor& dst) = 0;
  virtual void matmul_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& y, float alpha,
                           float beta) = 0;
  virtual void add_bias_impl(Tensor& y, const Tensor& bias) = 0;
  virtual void bias_grad_impl(const Tensor& dy, Tensor& db, float beta) = 0;
  virtual void linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, LinearAct act,
                           Tensor* pre_act) = 0;
  virtual void linear_backward_input_impl(const Tensor& dy, const Tensor& w, Tensor& dx, LinearAct act,
                                          const Tensor& act_in) = 0;
  virtual void grouped_matmul_impl(const Tensor& a, const std::vector<Tensor>& b, bool trans_b, Tensor& y,
                                   const std::vector<int64_t>& offsets, float beta) = 0;
  virtual void grouped_matmul_weight_impl(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                          const std::vector<Tensor>& dw, float beta) = 0;
  // FP8: only a backend whose supports() takes the fp8 dtypes reaches these (the front door refuses the others).
  virtual void fp8_quantize_impl(const Tensor& x, Fp8Tiling tiling, Tensor& q, Tensor& scales);
  virtual void fp8_amax_impl(const Tensor& x, Fp8Tiling tiling, Tensor& amax);
  virtual void fp8_quantize_amax_impl(const Tensor& x, Fp8Tiling tiling, const Tensor& amax, Tensor& q, Tensor& scales);
  virtual void fp8_matmul_impl(const Tensor& a, const Tensor& a_scales, Fp8Tiling a_tiling, bool trans_a,
                               const Tensor& b, const Tensor& b_scales, Fp8Tiling b_tiling, bool trans_b, Tensor& y,
                               float beta);
  virtual void activation_forward_impl(Activation act, const Tensor& x, Tensor& y) = 0;
  virtual void activation_backward_impl(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void scale_impl(Tensor& x, float s) = 0;
  virtual void add_impl(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  virtual double sum_squares_impl(const Tensor& x) = 0;
  virtual void layernorm_forward_impl(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                      Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                             const Tensor& mean, const Tensor& rstd, Tensor& dx) = 0;
  virtual void layernorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                              const Tensor& rstd, Tensor& dgamma, Tensor& dbeta) = 0;
  virtual void rmsnorm_forward_impl(const Tensor& x, const Tensor& gamma, float eps, Tensor& y, Tensor& rstd) = 0;
  virtual void rmsnorm_backward_input_impl(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                           Tensor& dx) = 0;
  virtual void rmsnorm_backward_weight_impl(const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                            Tensor& dgamma) = 0;
  virtual void swiglu_forward_impl(const Tensor& gate, const Tensor& up, Tensor& h) = 0;
  virtual void swiglu_backward_impl(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate,
                                    Tensor& dup) = 0;
  virtual void moe_router_forward_impl(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse,
                                      Tensor& experts, Tensor& weights, const Tensor& bias) = 0;
  virtual void moe_router_backward_impl(const Tensor& probs, const Tensor& lse, const Tensor& experts,
                                       const Tensor& dweights, bool renormalize, const Tensor& seq_grad, int64_t T,
                                       float z_scale, Tensor& dlogits) = 0;
  // The CPU's and CUDA's (kernels/cuda/moe_group_router.cu); others refuse with a message naming the op.
  virtual void moe_group_router_forward_impl(const Tensor& logits, const GroupRouting& r, Tensor& probs,
                                             Tensor& experts, Tensor& weights, const Tensor& bias);
  virtual void moe_group_router_backward_impl(const Tensor& probs, const Tensor& experts, const Tensor& dweights,
                                              const GroupRouting& r, const Tensor& seq_grad, int64_t T,
                                              Tensor& dlogits);
  virtual void moe_combine_impl(const Tensor& rows, const Tensor& pos, const Tensor& weights, Tensor& y) = 0;
  virtual void moe_combine_backward_impl(const Tensor& dy, const Tensor& rows, const Tensor& pos,
                                        const Tensor& weights, Tensor& drows, Tensor& dweights) = 0;
  // gather: src x (n, heads * head_width), dst pe (n, heads * dr); else src pe, dst x.
  virtual void rotary_columns_impl(const Tensor& src, Tensor& dst, int64_t head_width, int64_t off, bool interleaved,
                                   bool gather) = 0;
  virtual void rope_impl(const Tensor& x, int64_t T, int64_t head_dim, double theta, int64_t pos0, bool inverse,
                         Tensor& y, const Tensor& positions, const RopeScaling& scaling) = 0;
  virtual void cross_entropy_impl(const Tensor& logits, const Tensor& targets, float grad_scale, Tensor& losses,
                                  Tensor* dlogits) = 0;
  virtual void mse_impl(const Tensor& pred, const Tensor& target, float grad_scale, Tensor& losses,
                        Tensor* dpred) = 0;
  virtual void argmax_impl(const Tensor& logits, Tensor& out) = 0;
  virtual void row_max_impl(const Tensor& x, Tensor& out) = 0;
  virtual void cross_entropy_partial_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                          const Tensor& row_max, Tensor& partial) = 0;
  virtual void cross_entropy_finish_impl(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                         const Tensor& row_max, const Tensor& total, float grad_scale, Tensor& losses,
                                         Tensor* dlogits) = 0;
  virtual void embedding_forward_impl(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t T,
                                      Tensor& out, int64_t vocab_start, const Tensor& positions) = 0;
  virtual void embedding_backward_impl(const Tensor& tokens, const Tensor& dout, int64_t T, Tensor& dwte,
                                       Tensor& dwpe, int64_t vocab_start, const Tensor& positions) = 0;
  virtual void attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& att,
                                      Tensor& out) = 0;
  virtual void attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& att, int64_t B, int64_t T,
                                       int64_t H, Tensor& dqkv) = 0;
  virtual void flash_attention_forward_impl(const Tensor& qkv, int64_t B, int64_t T, int64_t H, Tensor& out,
                                            Tensor& lse, const Tensor& doc_start) = 0;
  virtual void flash_attention_backward_impl(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                             const Tensor& lse, int64_t B, int64_t T, int64_t H, Tensor& dqkv, const Tensor& doc_start) = 0;
  virtual void attention_decode_impl(const Tensor& qkv, Tensor& kcache, Tensor& vcache, int64_t t, int64_t H,
                                     Tensor& out) = 0;
  virtual void flash_attention_gqa_forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, int64_t B,
                                                int64_t T, int64_t H, int64_t KV, Tensor& out, Tensor& lse, const Tensor& doc_start) = 0;
  virtual void flash_attention_gqa_backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, int64_t B, int64_t T, int64_t H,
                                                 int64_t KV, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) = 0;
  virtual void attention_decode_gqa_impl(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kcache,
                                         Tensor& vcache, int64_t t, int64_t H, int64_t KV, Tensor& out) = 0;
  // The CPU's and CUDA's; others refuse with a message naming the op.
  virtual void attention_decode_latent_impl(const Tensor& q, const Tensor& kv, Tensor& cache, int64_t t, int64_t H,
                                            float scale, Tensor& out);
  // Default: adamw_step_impl on each slot.
  virtual void adamw_step_many_impl(const std::vector<AdamWSlot>& slots, const AdamWArgs& args);
  virtual void adamw_step_impl(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                               const AdamWArgs& args, Tensor& work) = 0;
  virtual void sgd_step_impl(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdArgs& args,
                             Tensor& work) = 0;

 private:
  std::unique_ptr<detail::HostMarks> host_marks_;
};

// A tensor read as a matrix (rows, cols): the leading dimension is the rows, the rest the columns; a
// scalar or vector is one column. Every backend and the front door use these two.
int64_t rows_of(const Tensor& t);
int64_t cols_of(const Tensor& t);

struct BackendOptions {
  Device device = Device::cpu;
  int threads = 1;        // CPU threads for this rank
  int gpu = 0;            // CUDA device index (local rank mod visible GPUs)
  Precision precision = Precision::fp32;
  std::string cpu_bf16_gemm = "auto";  // train.cpu_bf16_gemm: auto | native | widened
  // "auto": whether this process times the bf16 test GEMM (CpuBackend); false where another rank's choice is adopted
  bool time_bf16_gemm = true;
};

// Makes the backend for the options; a clear relay::Error when the device is not available
// (train.device = "cuda" in a build without CUDA, or on a machine without a GPU).
std::unique_ptr<Backend> make_backend(const BackendOptions& opts);
// Number of usable CUDA devices (0 in a CPU-only build or without a GPU).
int cuda_device_count();
// The device train.device names: "cpu", "cuda", or "auto" (a GPU when one is visible).
Device resolve_device(const std::string& setting);

}  // namespace relay
