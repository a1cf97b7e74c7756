// GPT-2's blocks (Radford et al. 2019; nanoGPT's model.py is the reference module): the embedding
// (token + learned position), the pre-LayerNorm transformer block (causal multi-head self-attention
// and a 4x GELU-tanh MLP, each with a residual) and the head (ln_f, then logits against the token
// embedding when tied). Rows are tokens: a micro-batch of S sequences of T tokens has S*T rows.
//
// Attention is FlashAttention-2's (arXiv:2307.08691): the T x T probabilities are never stored, only each
// query row's log-sum-exp (B, H, T). Under train.precision = "bf16" activations and the working weights
// are bf16; LayerNorm statistics and the log-sum-exp stay f32, weight gradients accumulate in f32. Under "fp8" the
// four linear layers' GEMMs take FP8 operands (model/fp8_linear.hpp); the rest is as in bf16.
//
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with tp ranks: each rank holds H/tp heads of the
// attention (QKV column-parallel, the output projection row-parallel) and 4C/tp of the MLP's hidden
// units (c_fc column-parallel, c_proj row-parallel); one all-reduce after each row-parallel projection
// in the forward and one of each column-parallel input gradient in the backward. LayerNorms, the
// row-parallel biases and the position embedding are replicated and their gradients are equal on every
// tp rank. The token embedding and the head are vocabulary-parallel. With tp = 1 every all-reduce is a
// no-op and the arithmetic is exactly the serial model's.
//
// Sequence parallelism (model/tensor_parallel.hpp): blocks pass (n / tp, C) rows; the embedding reduce-scatters its
// partial sums instead of all-reducing them, a transformer block all-gathers ln_1's and ln_2's outputs before QKV and
// c_fc and reduce-scatters the c_proj sums (the backward the reverse, and backward-weight gathers again what the
// weight gradients need: the output gradients and the norms' outputs, so the row-parallel biases' gradients come
// from every row), the head gathers ln_f's output. The LayerNorm weight gradients are summed over the group.
// With parallel.overlap (issue 40) the gathers before QKV and c_fc and the reduce-scatters after the c_projs run as
// collective matmuls (model/collective_matmul.hpp), and B and W together all-reduce (under sequence parallelism
// reduce-scatter) QKV's and c_fc's input gradients while their weight gradients are computed (model/tensor_parallel.hpp);
// the backward's rings of the output gradient and d res1 feed the c_projs' weight gradients too (ring_weights_early).
#include <cmath>

#include "model/blocks.hpp"
#include "model/collective_matmul.hpp"
#include "model/fp8_linear.hpp"

namespace relay {

namespace {

// x i32 (n) token ids -> y (n, C) = wte[x] + wpe[position]. Params: wte (V, C), and GPT-2's learned
// positions wpe (block_size, C) (Llama has none: its positions are rotary, inside attention).
// Vocabulary-parallel: rank r holds wte rows [vocab_start, ...); the other ranks' tokens give 0 and the
// all-reduce adds the one rank's row (exactly: the rest are zeros); tp rank 0 alone adds the positions.
class Embedding final : public Block {
 public:
  Embedding(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp)
      : Block(spec, std::move(params)), tp_(tp),
        vocab_start_(tp_begin(params_[0]->full_shape[0], tp.size, tp.rank)) {}
  // x i32 (n) -> y (n, C), or (n / tp, C) this rank's rows under sequence parallelism.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved&) override {
    const Tensor none;
    Tensor sums = tp_.sequence_parallel() ? tp_.full_rows(be, x.size(0), spec_.out, y.dtype()) : y;  // (n, C)
    be.embedding_forward(x, param(0).compute(), tp_.rank == 0 ? positions() : none, spec_.seq_len, sums,
                         vocab_start_, positions_);  // positions_: restarting with each document (data.document_mask)
    if (tp_.sequence_parallel()) tp_.reduce_scatter_rows(sums, y, "the embedding reduce-scatter");
    else tp_.allreduce_sum(y, "the embedding all-reduce");  // (n, C)
  }
  void backward_input(Backend&, const Tensor&, const Tensor&, Tensor&, BlockSaved&) override {
    RELAY_ASSERT(false, "the embedding has no input gradient (its input is token ids)");
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved&) override {
    Tensor none;
    const Tensor dy_all = tp_.all_rows(be, dy, "the embedding's output-gradient all-gather");  // (n, C)
    be.embedding_backward(x, dy_all, spec_.seq_len, param(0).grad, has_wpe() ? param(1).grad : none, vocab_start_,
                          positions_);
  }
  bool can_decode() const override { return true; }
  // x i32 (n): the tokens at position t -> y (n, C), with wpe's row t (one position per "sequence").
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t t, BlockSaved&) override {
    const Tensor wpe_t = has_wpe() ? param(1).compute().rows(t, 1) : Tensor();  // (1, C)
    be.embedding_forward(x, param(0).compute(), wpe_t, 1, y);
  }

 private:
  bool has_wpe() const { return params_.size() > 1; }
  Tensor positions() { return has_wpe() ? param(1).compute() : Tensor(); }
  TensorParallel tp_;
  int64_t vocab_start_;
};

// Parameter roles of a transformer block, in spec order; biases are absent when model.bias = false.
struct TransformerParams {
  Param *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *mproj_w, *mproj_b;
};

TransformerParams transformer_params(const std::vector<Param*>& p, bool bias) {
  TransformerParams r{};
  size_t i = 0;
  auto next = [&](bool present) { return present ? p.at(i++) : nullptr; };
  r.ln1_w = next(true);
  r.ln1_b = next(bias);
  r.attn_w = next(true);
  r.attn_b = next(bias);
  r.proj_w = next(true);
  r.proj_b = next(bias);
  r.ln2_w = next(true);
  r.ln2_b = next(bias);
  r.fc_w = next(true);
  r.fc_b = next(bias);
  r.mproj_w = next(true);
  r.mproj_b = next(bias);
  RELAY_ASSERT(i == p.size(), "transformer block: " << p.size() << " params, expected " << i);
  return r;
}

// LayerNorm without a bias (model.bias = false) uses a zero beta that is never trained.
const Tensor& beta_or_zero(const Param* b, const Tensor& zero) { return b ? b->compute() : zero; }

// y = x + proj(attn(ln_1(x))); out = y + mproj(gelu(fc(ln_2(y)))). x, out (n, C).
class Transformer final : public Block {
 public:
  Transformer(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp, const ContextParallel& cp)
      : Block(spec, std::move(params)), p_(transformer_params(params_, spec.bias)), tp_(tp),
        H_(spec.n_head / tp.size), Cl_(spec.in / tp.size),
        cp_attn_(cp.on() ? cp.attention : nullptr), fp8_(fp8_linear(spec, tp.comm)) {
    RELAY_ASSERT(tp.sequence_parallel() == (spec.sp > 1), "transformer block: sequence parallelism disagrees");
  }

  // saved.t: the forward's intermediates, then the backward-input's gradients that backward-weight reads.
  // Widths are this tp rank's: Cl = C / tp (its H / tp heads), 4 Cl hidden units.
  // kLse: the attention's log-sum-exp per (sequence, head, query), the only attention state kept: (B, H, T) for
  // n = B x T rows, held as (n, H) (under context parallelism a rank's sequences have T / cp rows).
  // Under sequence parallelism the row-wise ones (local()) hold this rank's m = n / tp rows.
  enum : size_t { kLn1, kMean1, kRstd1, kQkv, kLse, kAtty, kRes1, kLn2, kMean2, kRstd2, kFch, kFcg,
                  kGRes1, kGFch, kGLn2, kGQkv, kGLn1, kCount };
  static bool local(size_t k) {
    return k == kLn1 || k == kMean1 || k == kRstd1 || k == kRes1 || k == kLn2 || k == kMean2 || k == kRstd2 ||
           k == kGRes1 || k == kGLn2 || k == kGLn1;
  }
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n, int tp) {
    const int64_t C = spec.in, H = spec.n_head / tp, Cl = C / tp, m = n / spec.sp;
    const DType a = spec.dtype, f32 = DType::f32;
    std::vector<BufferSpec> s(kCount);
    s[kLn1] = {{m, C}, a};
    s[kMean1] = {{m}, f32};
    s[kRstd1] = {{m}, f32};
    s[kQkv] = {{n, 3 * Cl}, a};
    s[kLse] = {{n, H}, f32};
    s[kAtty] = {{n, Cl}, a};
    s[kRes1] = {{m, C}, a};
    s[kLn2] = {{m, C}, a};
    s[kMean2] = {{m}, f32};
    s[kRstd2] = {{m}, f32};
    s[kFch] = {{n, 4 * Cl}, a};
    s[kFcg] = {{n, 4 * Cl}, a};
    s[kGRes1] = {{m, C}, a, true};  // from here on backward_input's, for backward_weight
    s[kGFch] = {{n, 4 * Cl}, a, true};
    s[kGLn2] = {{m, C}, a, true};
    s[kGQkv] = {{n, 3 * Cl}, a, true};
    s[kGLn1] = {{m, C}, a, true};
    return s;
  }
  void allocate_saved(Backend& be, int64_t n, BlockSaved& s) override {
    allocate_buffers(be, saved_shapes(spec_, n, tp_.size), s);
    make_zero(be);
    if (tp_.sequence_parallel()) norm_grads_.allocate(be, spec_.in);
  }

  // Generation: the key and value caches (n, max_len, C) and one position's intermediates.
  enum : size_t { dK, dV, dLn, dMean, dRstd, dQkv, dAtty, dRes, dFc, dCount };
  bool can_decode() const override { return !tp_.on(); }
  void allocate_decode(Backend& be, int64_t n, int64_t max_len, BlockSaved& c) override {
    const int64_t C = spec_.in;
    const DType a = spec_.dtype, f32 = DType::f32;
    allocate_buffers(be, {{{n, max_len, C}, a}, {{n, max_len, C}, a}, {{n, C}, a}, {{n}, f32}, {{n}, f32},
                          {{n, 3 * C}, a}, {{n, C}, a}, {{n, C}, a}, {{n, 4 * C}, a}}, c.t);
    make_zero(be);
  }
  DecodeCache decode_cache() const override {
    const int64_t b = 2 * spec_.in * int64_t(dtype_size(spec_.dtype));
    return {b, b, cat("2 x ", spec_.n_head, " heads x ", spec_.in / spec_.n_head)};
  }
  // x, y (n, C) at position t: the forward of one position, attending over the cached ones.
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t t, BlockSaved& c) override {
    Tensor &ln = c.t[dLn], &mean = c.t[dMean], &rstd = c.t[dRstd], &qkv = c.t[dQkv], &atty = c.t[dAtty];
    Tensor &res = c.t[dRes], &fc = c.t[dFc];
    be.layernorm_forward(x, p_.ln1_w->compute(), beta_or_zero(p_.ln1_b, zero_), float(spec_.eps), ln, mean, rstd);
    linear(be, ln, *p_.attn_w, p_.attn_b, qkv);                                    // (n, 3C)
    be.attention_decode(qkv, c.t[dK], c.t[dV], t, spec_.n_head, atty);            // (n, C)
    linear(be, atty, *p_.proj_w, p_.proj_b, res);
    be.add(res, x, res);                                                          // residual 1
    be.layernorm_forward(res, p_.ln2_w->compute(), beta_or_zero(p_.ln2_b, zero_), float(spec_.eps), ln, mean, rstd);
    be.linear(ln, p_.fc_w->compute(), bias_of(p_.fc_b), fc, LinearAct::gelu_tanh);  // (n, 4C)
    linear(be, fc, *p_.mproj_w, p_.mproj_b, y);
    be.add(y, res, y);                                                            // residual 2
  }

  // x, y (m, C): m = n rows, or n / tp this rank's under sequence parallelism.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor ln1 = v(kLn1), mean1 = v(kMean1), rstd1 = v(kRstd1), qkv = v(kQkv), lse = lse_view(s, n), atty = v(kAtty);
    Tensor res1 = v(kRes1), ln2 = v(kLn2), mean2 = v(kMean2), rstd2 = v(kRstd2), fch = v(kFch), fcg = v(kFcg);
    be.layernorm_forward(x, p_.ln1_w->compute(), beta_or_zero(p_.ln1_b, zero_), float(spec_.eps), ln1, mean1, rstd1);
    // (n, 3Cl) column-parallel; with the collective matmul chunk by chunk as ln_1's rows arrive
    gather_rows_matmul(be, tp_, tp_.collective_matmul(fp8_), ln1, "the sequence-parallel all-gather of ln_1",
                       [&](int64_t r0, const Tensor& x) {
                         Tensor out = qkv.rows(r0, x.size(0));  // (rows, 3Cl)
                         fp8_.linear(be, x, *p_.attn_w, bias_of(p_.attn_b), out);
                       });
    if (cp_attn_)  // context parallelism: this rank's chunks against the group's gathered keys
      cp_attn_->forward_packed(be, qkv, T, H_, q_pos_, doc_start_, atty, lse);  // (n, Cl)
    else
      be.flash_attention_forward(qkv, n / T, T, H_, atty, lse, doc_start_);  // (n, Cl) this rank's heads
    row_linear(be, atty, *p_.proj_w, p_.proj_b, res1, "the attention output");  // (m, C)
    be.add(res1, x, res1);                                                // residual 1
    be.layernorm_forward(res1, p_.ln2_w->compute(), beta_or_zero(p_.ln2_b, zero_), float(spec_.eps), ln2, mean2, rstd2);
    // (n, 4Cl); with the collective matmul chunk by chunk as ln_2's rows arrive
    gather_rows_matmul(be, tp_, tp_.collective_matmul(fp8_), ln2, "the sequence-parallel all-gather of ln_2",
                       [&](int64_t r0, const Tensor& x) {
                         Tensor out = fcg.rows(r0, x.size(0)), pre = fch.rows(r0, x.size(0));  // (rows, 4Cl) each
                         fp8_.linear(be, x, *p_.fc_w, bias_of(p_.fc_b), out, LinearAct::gelu_tanh, &pre);
                       });
    row_linear(be, fcg, *p_.mproj_w, p_.mproj_b, y, "the MLP output");  // (m, C)
    be.add(y, res1, y);                                                   // residual 2
  }

  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor g_res1 = v(kGRes1), g_fch = v(kGFch), g_ln2 = v(kGLn2), g_qkv = v(kGQkv), g_ln1 = v(kGLn1);
    if (cp_attn_) cp_attn_->prefetch_backward_packed(be, v(kQkv), T);  // overlap: behind the GEMMs up to attention
    // (n, 4Cl) d fch; with the collective matmul chunk by chunk as the output gradient's rows arrive
    const Tensor dy_all = gather_rows_matmul(  // (n, C)
        be, tp_, tp_.collective_matmul(fp8_), dy, "the sequence-parallel all-gather of the output gradient",
        [&](int64_t r0, const Tensor& d) {
          Tensor out = g_fch.rows(r0, d.size(0));  // (rows, 4Cl)
          fp8_.linear_backward_input(be, d, *p_.mproj_w, out, LinearAct::gelu_tanh, v(kFch).rows(r0, d.size(0)));
        });
    if (ring_weights_early()) linear_grad(be, dy_all, v(kFcg), *p_.mproj_w, p_.mproj_b);
    tp_.column_input_grad(  // (m, C) d ln2
        be, g_ln2, n, "the MLP input-gradient", [&](Tensor& sums) { fp8_.matmul(be, g_fch, *p_.fc_w, false, sums); },
        early_weights_, v(kLn2), "the sequence-parallel all-gather of ln_2",
        [&](const Tensor& ln2_all) { linear_grad(be, g_fch, ln2_all, *p_.fc_w, p_.fc_b); });
    Tensor tmp = g_ln1;                                                               // (m, C) scratch
    be.layernorm_backward_input(g_ln2, v(kRes1), p_.ln2_w->compute(), v(kMean2), v(kRstd2), tmp);
    be.add(dy, tmp, g_res1);                                                          // (m, C) d res1
    Tensor g_atty = g_ln1.view({m * spec_.in}).rows(0, n * Cl_).view({n, Cl_});      // (n, Cl) scratch
    // (n, Cl) d atty; with the collective matmul chunk by chunk as d res1's rows arrive
    const Tensor g_res1_all = gather_rows_matmul(  // (n, C)
        be, tp_, tp_.collective_matmul(fp8_), g_res1, "the sequence-parallel all-gather of d res1",
        [&](int64_t r0, const Tensor& d) {
          Tensor out = g_atty.rows(r0, d.size(0));  // (rows, Cl)
          fp8_.matmul(be, d, *p_.proj_w, false, out);
        });
    if (ring_weights_early()) linear_grad(be, g_res1_all, v(kAtty), *p_.proj_w, p_.proj_b);
    if (cp_attn_)  // cp_weights_early(): c_proj's and the output projection's weight gradients while dk, dv travel
      cp_attn_->backward_packed(be, g_atty, v(kQkv), v(kAtty), lse_view(s, n), T, H_, q_pos_, doc_start_, g_qkv,
                                [&] {
                                  if (!cp_weights_early()) return;
                                  linear_grad(be, dy, v(kFcg), *p_.mproj_w, p_.mproj_b);
                                  linear_grad(be, g_res1, v(kAtty), *p_.proj_w, p_.proj_b);
                                });
    else
      be.flash_attention_backward(g_atty, v(kQkv), v(kAtty), lse_view(s, n), n / T, T, H_, g_qkv, doc_start_);  // (n, 3Cl)
    tp_.column_input_grad(  // (m, C) d ln1
        be, g_ln1, n, "the attention input-gradient",
        [&](Tensor& sums) { fp8_.matmul(be, g_qkv, *p_.attn_w, false, sums); }, early_weights_, v(kLn1),
        "the sequence-parallel all-gather of ln_1",
        [&](const Tensor& ln1_all) { linear_grad(be, g_qkv, ln1_all, *p_.attn_w, p_.attn_b); });
    be.layernorm_backward_input(g_ln1, x, p_.ln1_w->compute(), v(kMean1), v(kRstd1), dx);
    be.add(dx, g_res1, dx);                                                           // residual 1
  }

  // B and W together with the asynchronous input-gradient all-reduce (tp_.async_input_grads()): c_fc's and c_attn's
  // weight gradients are computed inside backward_input, while their input gradients' all-reduces travel.
  bool weights_in_backward() const override {
    return tp_.async_input_grads() || (cp_attn_ && cp_attn_->overlaps() && !tp_.on());
  }
  // Inside backward() under context parallelism with overlap (and no tp): besides c_fc's and c_attn's weight gradients
  // (column_input_grad's early form, which without tp computes them at once), c_proj's and the output projection's
  // are computed while the attention's key-gradient reduce-scatters travel. Independent GEMMs moved earlier: every
  // gradient is the same sum as before.
  bool cp_weights_early() const { return early_weights_ && cp_attn_ && !tp_.on(); }
  // Inside backward() with sequence parallelism's collective matmuls: c_proj's and the output projection's weight
  // gradients right after the ring that gathered their output gradients' rows (the output gradient, d res1), from
  // those rows, instead of gathering them again in backward_weight, where that gather waited with nothing beside it.
  // The same GEMM on the same operands: the same bits.
  bool ring_weights_early() const { return early_weights_ && tp_.collective_matmul(fp8_); }

  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    const bool sp = tp_.sequence_parallel();
    if (sp) norm_grads_.begin(be);
    // Under sequence parallelism each operand of (n) rows is gathered when it is needed (one buffer at a time).
    if (!cp_weights_early() && !ring_weights_early())
      linear_grad(be, tp_.all_rows(be, dy, "the sequence-parallel all-gather of the output gradient"), v(kFcg),
                  *p_.mproj_w, p_.mproj_b);
    if (!early_weights_)
      linear_grad(be, v(kGFch), tp_.all_rows(be, v(kLn2), "the sequence-parallel all-gather of ln_2"), *p_.fc_w,
                  p_.fc_b);
    ln_grad(be, v(kGLn2), v(kRes1), v(kMean2), v(kRstd2), *p_.ln2_w, p_.ln2_b, 2);
    if (!cp_weights_early() && !ring_weights_early())
      linear_grad(be, tp_.all_rows(be, v(kGRes1), "the sequence-parallel all-gather of d res1"), v(kAtty),
                  *p_.proj_w, p_.proj_b);
    if (!early_weights_)
      linear_grad(be, v(kGQkv), tp_.all_rows(be, v(kLn1), "the sequence-parallel all-gather of ln_1"), *p_.attn_w,
                  p_.attn_b);
    ln_grad(be, v(kGLn1), x, v(kMean1), v(kRstd1), *p_.ln1_w, p_.ln1_b, 0);
    if (sp)
      norm_grads_.finish(be, tp_, {&p_.ln1_w->grad, p_.ln1_b ? &p_.ln1_b->grad : nullptr, &p_.ln2_w->grad,
                                   p_.ln2_b ? &p_.ln2_b->grad : nullptr});
  }

 private:
  // Saved buffer k for a micro-batch of n rows of which this rank holds m (row-wise buffers: local()).
  static Tensor view(BlockSaved& s, size_t k, int64_t m, int64_t n) { return s.t[k].rows(0, local(k) ? m : n); }
  void make_zero(Backend& be) {
    if (spec_.bias || zero_.defined()) return;
    zero_ = Tensor(be, {spec_.in}, spec_.dtype);
    be.fill(zero_, 0.f);
  }
  Tensor lse_view(BlockSaved& s, int64_t n) const { return s.t[kLse].rows(0, n); }
  // y (n, out) = x (n, in) @ W^T (+ b)
  static void linear(Backend& be, const Tensor& x, const Param& w, const Param* b, Tensor& y) {
    be.linear(x, w.compute(), bias_of(b), y);
  }
  // The bias a fused linear adds: undefined for a model without biases.
  static Tensor bias_of(const Param* b) { return b ? b->compute() : Tensor(); }
  // Row-parallel: y (n, out) = sum over tp of x_r (n, in/tp) @ W_r^T (y: this rank's rows of it under sequence
  // parallelism), then the replicated bias.
  void row_linear(Backend& be, const Tensor& x, const Param& w, const Param* b, Tensor& y, const char* of) {
    tp_.row_parallel_matmul(be, x, w, true, y, of, fp8_);
    if (b) be.add_bias(y, b->compute());
  }
  // dW (out, in) += dy^T @ x; db (out) += colsum(dy)
  void linear_grad(Backend& be, const Tensor& dy, const Tensor& x, Param& w, Param* b) const {
    fp8_.weight_grad(be, dy, x, w.grad);
    if (b) be.bias_grad(dy, b->grad, 1.f);
  }
  // The LayerNorm's weight (and bias) gradients; under sequence parallelism into norm_grads_'s parts first, first and
  // first + 1, to be summed over the group.
  void ln_grad(Backend& be, const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd, Param& w,
               Param* b, int first) {
    if (tp_.sequence_parallel()) {
      Tensor dw = norm_grads_.part(first), db = norm_grads_.part(first + 1);
      be.layernorm_backward_weight(dy, x, mean, rstd, dw, db);
    } else if (b) {
      be.layernorm_backward_weight(dy, x, mean, rstd, w.grad, b->grad);
    } else {  // the beta gradient goes to a scratch vector that no optimizer sees
      if (!dbeta_scratch_.defined()) dbeta_scratch_ = Tensor(be, {spec_.in});  // f32, as gradients are
      be.layernorm_backward_weight(dy, x, mean, rstd, w.grad, dbeta_scratch_);
    }
  }

  TransformerParams p_;
  TensorParallel tp_;
  int64_t H_, Cl_;               // this rank's heads and attention width
  Tensor zero_, dbeta_scratch_;  // (C), only when model.bias = false
  std::shared_ptr<CpAttention> cp_attn_;  // parallel.cp > 1: the rank's shared one
  SpNormGrads norm_grads_;  // sequence parallelism: ln_1's and ln_2's weight and bias gradients
  Fp8Linear fp8_;           // qkv, proj, fc and mproj's GEMMs: FP8 under train.precision = "fp8", else the backend's
};

// x (n, C) -> logits (n, V) = norm(x) @ W^T, W the token embedding (tied) or lm_head.weight; norm is
// GPT-2's ln_f (LayerNorm) or Llama's model.norm (RMSNorm, weight only).
// Params: the norm's weight, [its bias], W (V, C). saved: norm out (n, C), mean, rstd (n), d norm out (n, C)
// (mean unused by RMSNorm). Vocabulary-parallel: this rank's logits are columns [vocab_start, ...) of
// (n, V), out_width() of them; the input gradient is summed over the tp group.
class Head final : public Block {
 public:
  Head(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp)
      : Block(spec, std::move(params)), tp_(tp) {
    ln_w_ = params_[0];
    ln_b_ = spec.bias ? params_[1] : nullptr;
    w_ = params_.back();
    out_width_ = w_->shape[0];  // (ZeRO-3 holds no whole value)
  }
  int64_t out_width() const override { return out_width_; }
  // Under sequence parallelism every buffer holds this rank's m = n / tp rows.
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n) {
    const DType a = spec.dtype, f32 = DType::f32;
    const int64_t m = n / spec.sp;
    return {{{m, spec.in}, a}, {{m}, f32}, {{m}, f32}, {{m, spec.in}, a, true}};  // norm out, mean, rstd, d norm out
  }
  void allocate_saved(Backend& be, int64_t n, BlockSaved& s) override {
    const int64_t C = spec_.in;
    allocate_buffers(be, saved_shapes(spec_, n), s);
    if (tp_.sequence_parallel()) norm_grads_.allocate(be, C);
    if (!spec_.bias && spec_.norm == NormKind::layernorm) {
      zero_ = Tensor(be, {C}, spec_.dtype);
      be.fill(zero_, 0.f);
      dbeta_scratch_ = Tensor(be, {C});
    }
  }
  // x (m, C): m = n rows, or this rank's n / tp under sequence parallelism -> y (n, Vl) every row's logits.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    const int64_t m = x.size(0);
    Tensor lnf = s.t[0].rows(0, m), mean = s.t[1].rows(0, m), rstd = s.t[2].rows(0, m);
    if (spec_.norm == NormKind::rmsnorm) be.rmsnorm_forward(x, ln_w_->compute(), float(spec_.eps), lnf, rstd);
    else be.layernorm_forward(x, ln_w_->compute(), beta_or_zero(ln_b_, zero_), float(spec_.eps), lnf, mean, rstd);
    // (n, C) @ (C, Vl): this rank's vocabulary columns; with the collective matmul chunk by chunk as the final norm's
    // rows arrive
    gather_rows_matmul(be, tp_, tp_.collective_matmul(Fp8Linear()), lnf,
                       "the sequence-parallel all-gather of the final norm", [&](int64_t r0, const Tensor& x) {
                         Tensor out = y.rows(r0, x.size(0));  // (rows, Vl)
                         be.matmul(x, false, w_->compute(), true, out, 1.f, 0.f);
                       });
  }
  // Sequence parallelism with overlap: B and W together, so that the final norm's rows W's gradient needs are
  // gathered while the input gradient's ring runs (ring_weights_early).
  bool weights_in_backward() const override { return tp_.collective_matmul(Fp8Linear()); }
  // Inside backward() with sequence parallelism's collective matmuls: the final norm's rows are gathered (into the
  // second buffer) while the input gradient's reduce-scatter ring and the norm's backward run, and W's gradient is
  // computed from them at the end of backward_input, instead of gathering them in backward_weight with nothing
  // beside it. The same GEMM on the same rows, in the same place among W's other contributions: the same bits.
  bool ring_weights_early() const { return early_weights_ && tp_.collective_matmul(Fp8Linear()); }
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t m = x.size(0);
    Tensor g = s.t[3].rows(0, m);
    TensorParallel::PendingGather lnf;  // (n, C) the final norm's rows, travelling (ring_weights_early)
    if (ring_weights_early())
      lnf = tp_.start_gather_rows(be, s.t[0].rows(0, m), "the sequence-parallel all-gather of the final norm");
    // (n, Vl) @ (Vl, C), partial over tp: summed into g (m, C)
    tp_.row_parallel_matmul(be, dy, w_->compute(), false, g, "the head's input-gradient");
    if (spec_.norm == NormKind::rmsnorm) be.rmsnorm_backward_input(g, x, ln_w_->compute(), s.t[2].rows(0, m), dx);
    else be.layernorm_backward_input(g, x, ln_w_->compute(), s.t[1].rows(0, m), s.t[2].rows(0, m), dx);
    if (ring_weights_early()) be.matmul(dy, true, tp_.finish_gather(lnf), false, w_->grad, 1.f, 1.f);  // (V, n) @ (n, C)
  }
  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved& s) override {
    const int64_t m = x.size(0);
    if (!ring_weights_early()) {
      const Tensor lnf_all = tp_.all_rows(be, s.t[0].rows(0, m), "the sequence-parallel all-gather of the final norm");
      be.matmul(dy, true, lnf_all, false, w_->grad, 1.f, 1.f);  // (V, n) @ (n, C)
    }
    const bool sp = tp_.sequence_parallel();
    if (sp) norm_grads_.begin(be);
    Tensor dw = sp ? norm_grads_.part(0) : ln_w_->grad;
    if (spec_.norm == NormKind::rmsnorm) {
      be.rmsnorm_backward_weight(s.t[3].rows(0, m), x, s.t[2].rows(0, m), dw);
    } else {
      Tensor db = sp ? norm_grads_.part(1) : ln_b_ ? ln_b_->grad : dbeta_scratch_;
      be.layernorm_backward_weight(s.t[3].rows(0, m), x, s.t[1].rows(0, m), s.t[2].rows(0, m), dw, db);
    }
    if (sp) norm_grads_.finish(be, tp_, {&ln_w_->grad, ln_b_ ? &ln_b_->grad : nullptr});
  }
  // Generation: the forward itself, on one position's scratch.
  bool can_decode() const override { return !tp_.on(); }
  void allocate_decode(Backend& be, int64_t n, int64_t, BlockSaved& c) override { allocate_saved(be, n, c); }
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t, BlockSaved& c) override { forward(be, x, y, c); }

 private:
  TensorParallel tp_;
  Param *ln_w_, *ln_b_, *w_;
  int64_t out_width_ = 0;  // this rank's vocabulary columns
  Tensor zero_, dbeta_scratch_;
  SpNormGrads norm_grads_;  // sequence parallelism: the final norm's weight (and bias) gradients
};

}  // namespace

std::vector<BufferSpec> gpt_saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  switch (spec.kind) {
    case BlockKind::transformer: return Transformer::saved_shapes(spec, rows, tp);
    case BlockKind::head: return Head::saved_shapes(spec, rows);
    default: return {};
  }
}

std::unique_ptr<Block> make_gpt_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                      const ContextParallel& cp) {
  switch (spec.kind) {
    case BlockKind::embedding: return std::make_unique<Embedding>(spec, std::move(params), tp);
    case BlockKind::transformer: return std::make_unique<Transformer>(spec, std::move(params), tp, cp);
    case BlockKind::head: return std::make_unique<Head>(spec, std::move(params), tp);
    default: break;
  }
  RELAY_ASSERT(false, "make_gpt_block: not a GPT block kind: " << block_kind_name(spec.kind));
}

}  // namespace relay
