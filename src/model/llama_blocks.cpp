// Llama's decoder layer (Touvron et al. 2023; transformers' LlamaDecoderLayer is the reference module):
//   h = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = input_layernorm(x)
//   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                        n2 = post_attention_layernorm(h)
// RMSNorms with a weight only, no biases anywhere, rotary positions (rotate-half, base rope_theta) on the
// queries and keys, grouped-query attention (n_kv_head key/value heads, each shared by n_head / n_kv_head
// query heads). The embedding (no learned positions) and the head (RMSNorm model.norm, then lm_head or the
// tied embedding) are the language-model blocks of gpt_blocks.cpp. Rows are tokens, as there.
//
// Attention is grouped-query FlashAttention-2: only each query row's log-sum-exp (B, H, T) is kept. The
// rotation is applied in place to q and k, which are kept rotated; the backward rotates their gradients
// back (rope's inverse) before the projections' gradients.
//
// Tensor parallelism (Megatron-LM): each tp rank holds n_head / tp query heads and n_kv_head / tp key/value
// heads (q/k/v_proj column-parallel, o_proj row-parallel) and ffn_hidden / tp SwiGLU units (gate/up
// column-parallel, down row-parallel); the RMSNorm weights are replicated. One all-reduce after each
// row-parallel projection and one of each column-parallel input gradient, as in GPT-2's block. Under sequence
// parallelism, as GPT-2's block too: (n / tp, C) rows in and out, the norms' outputs all-gathered before the
// column-parallel projections, reduce-scatters after the row-parallel ones, the RMSNorm weight gradients summed
// over the group.
//
// The same layer is Mixtral's and Qwen3-MoE's (transformers' MixtralDecoderLayer, Qwen3MoeDecoderLayer): with
// spec.moe on, the MLP is a mixture of experts (model/moe.hpp); with spec.qk_norm (Qwen3), q and k are RMS-normalised
// per head (q_norm, k_norm over head_dim) before the rotation; spec.head_dim may differ from C / n_head. Neither runs
// under tensor or context parallelism yet (refused by the config).
#include "model/blocks.hpp"
#include "model/collective_matmul.hpp"
#include "model/fp8_linear.hpp"
#include "model/moe.hpp"

namespace relay {

namespace {

// Parameter roles, in spec order (model_spec.cpp): norm1, q, k, v, o, [q_norm, k_norm], norm2, then the dense MLP's
// gate, up, down or the experts' router and (gate, up, down) per expert.
struct LlamaParams {
  Param *norm1, *q, *k, *v, *o, *q_norm = nullptr, *k_norm = nullptr, *norm2, *gate = nullptr, *up = nullptr,
        *down = nullptr;
};

class LlamaLayer final : public Block {
 public:
  LlamaLayer(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp, const ContextParallel& cp,
             const ExpertParallel& ep)
      : Block(spec, std::move(params)), tp_(tp), hd_(head_dim(spec)), H_(spec.n_head / tp.size),
        KV_(spec.n_kv_head / tp.size), F_(spec.moe.on() ? 0 : spec.ffn_hidden / tp.size),
        cp_attn_(cp.on() ? cp.attention : nullptr), ep_on_(ep.on()), fp8_(fp8_linear(spec, tp.comm)) {
    RELAY_ASSERT(tp.sequence_parallel() == (spec.sp > 1), "llama layer: sequence parallelism disagrees");
    const size_t attn = spec.qk_norm ? 8 : 6;  // norm1, q, k, v, o, [q_norm, k_norm], norm2
    const size_t want = attn + (spec.moe.on() ? size_t(1 + 3 * ep.local_experts(spec.moe.n_experts)) : 3);
    RELAY_ASSERT(params_.size() == want, "llama layer: " << params_.size() << " params, expected " << want);
    p_.norm1 = params_[0], p_.q = params_[1], p_.k = params_[2], p_.v = params_[3], p_.o = params_[4];
    if (spec.qk_norm) p_.q_norm = params_[5], p_.k_norm = params_[6];
    p_.norm2 = params_[attn - 1];
    if (spec.moe.on()) {
      moe_ = std::make_unique<MoeMlp>(spec, std::span<Param* const>(params_).subspan(attn), ep, tp, cp);
    } else {
      p_.gate = params_[attn], p_.up = params_[attn + 1], p_.down = params_[attn + 2];
    }
  }

  // saved.t: the forward's intermediates, then the gradients backward_input leaves for backward_weight (and kH, the
  // SwiGLU output: scratch the forward's down projection reads and backward_weight recomputes, bitwise the same).
  // Widths are this tp rank's: H heads of hd (queries), KV heads (keys, values), F SwiGLU units.
  // Under sequence parallelism the row-wise ones (local()) hold this rank's m = n / tp rows.
  // Then, sized 0 when unused: q_norm / k_norm's inputs, rstds and output gradients (qk_norm), the attention output's
  // gradient when it is wider than the rows' C (head_dim x n_head > C), and from kCount the experts' (moe.hpp).
  enum : size_t { kN1, kRstd1, kQ, kK, kV, kLse, kAtty, kRes1, kN2, kRstd2, kGate, kUp, kH,
                  kGRes1, kGGate, kGUp, kGN2, kGQ, kGK, kGV, kGN1, kQraw, kKraw, kRstdQ, kRstdK, kGQn, kGKn, kGAtty,
                  kCount };
  static bool local(size_t k) {
    return k == kN1 || k == kRstd1 || k == kRes1 || k == kN2 || k == kRstd2 || k == kGRes1 || k == kGN2 || k == kGN1;
  }
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n, int tp) {
    const int64_t C = spec.in, hd = head_dim(spec), m = n / spec.sp;
    const int64_t Hq = spec.n_head / tp * hd, Hkv = spec.n_kv_head / tp * hd;
    const int64_t F = spec.moe.on() ? 0 : spec.ffn_hidden / tp;
    const DType a = spec.dtype, f32 = DType::f32;
    std::vector<BufferSpec> s(kCount);
    s[kN1] = {{m, C}, a};
    s[kRstd1] = {{m}, f32};
    s[kQ] = {{n, Hq}, a};    // rotated
    s[kK] = {{n, Hkv}, a};   // rotated
    s[kV] = {{n, Hkv}, a};
    s[kLse] = {{n, spec.n_head / tp}, f32};  // (B, H, T) for n = B x T rows (T / cp under context parallelism)
    s[kAtty] = {{n, Hq}, a};
    s[kRes1] = {{m, C}, a};
    s[kN2] = {{m, C}, a};
    s[kRstd2] = {{m}, f32};
    s[kGate] = {{n, F}, a};
    s[kUp] = {{n, F}, a};
    s[kH] = {{n, F}, a, true};  // scratch: the forward's SwiGLU output, recomputed for down's weight gradient
    s[kGRes1] = {{m, C}, a, true};
    s[kGGate] = {{n, F}, a, true};
    s[kGUp] = {{n, F}, a, true};
    s[kGN2] = {{m, C}, a, true};
    s[kGQ] = {{n, Hq}, a, true};
    s[kGK] = {{n, Hkv}, a, true};
    s[kGV] = {{n, Hkv}, a, true};
    s[kGN1] = {{m, C}, a, true};
    const bool qk = spec.qk_norm;
    s[kQraw] = {{qk ? n : 0, Hq}, a};
    s[kKraw] = {{qk ? n : 0, Hkv}, a};
    s[kRstdQ] = {{qk ? n : 0, spec.n_head / tp}, f32};
    s[kRstdK] = {{qk ? n : 0, spec.n_kv_head / tp}, f32};
    s[kGQn] = {{qk ? n : 0, Hq}, a, true};
    s[kGKn] = {{qk ? n : 0, Hkv}, a, true};
    // d atty borrows d n1's (m, C) scratch when it fits: under sequence parallelism m = n / tp, so a model whose
    // heads are wider than the embedding per rank (Qwen3: H x head_dim > C) needs its own.
    s[kGAtty] = {{n * Hq > m * C ? n : 0, Hq}, a, true};
    if (spec.moe.on())
      for (const BufferSpec& b : MoeMlp::saved_shapes(spec, n, tp)) s.push_back(b);
    return s;
  }
  void allocate_saved(Backend& be, int64_t n, BlockSaved& s) override {
    allocate_buffers(be, saved_shapes(spec_, n, tp_.size), s);
    if (tp_.sequence_parallel()) norm_grads_.allocate(be, spec_.in);
    if (tp_.on() && spec_.qk_norm) qk_grads_.allocate(be, hd_);
  }

  // x, y (m, C): m = n rows, or n / tp this rank's under sequence parallelism.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor n1 = v(kN1), rstd1 = v(kRstd1), q = v(kQ), k = v(kK), val = v(kV), atty = v(kAtty), res1 = v(kRes1);
    Tensor n2 = v(kN2), rstd2 = v(kRstd2), gate = v(kGate), up = v(kUp), h = v(kH);
    Tensor lse = s.t[kLse].rows(0, n);
    const float eps = float(spec_.eps);
    be.rmsnorm_forward(x, p_.norm1->compute(), eps, n1, rstd1);               // (m, C)
    QkNorm qkn;
    if (spec_.qk_norm) qkn = {v(kQraw), v(kKraw), v(kRstdQ), v(kRstdK)};
    if (tp_.collective_matmul(fp8_)) {  // q, k, v's projections chunk by chunk as input_layernorm's rows arrive
      gather_rows_matmul(be, tp_, n1, "the sequence-parallel all-gather of input_layernorm",
                         [&](int64_t r0, const Tensor& rows) {
                           Tensor qr = q.rows(r0, m), kr = k.rows(r0, m), vr = val.rows(r0, m);  // (m, Hq), (m, Hkv)
                           QkNorm part = qkn;
                           if (spec_.qk_norm) part.qraw = qkn.qraw.rows(r0, m), part.kraw = qkn.kraw.rows(r0, m);
                           qkv_projections(be, rows, qr, kr, vr, part, fp8_);
                         });
      qkv_finish(be, q, k, T, 0, qkn);  // (n, Hq), (n, Hkv): normalised, rotated
    } else {
      attention_inputs(be, tp_.all_rows(be, n1, "the sequence-parallel all-gather of input_layernorm"), q, k, val, T,
                       0, qkn, fp8_);                                               // (n, Hq), (n, Hkv) x 2, rotated
    }
    if (cp_attn_)  // context parallelism: this rank's chunks against the group's gathered keys and values
      cp_attn_->forward(be, q, k, val, T, H_, KV_, q_pos_, doc_start_, atty, lse);  // (n, Hq)
    else
      be.flash_attention_gqa_forward(q, k, val, n / T, T, H_, KV_, atty, lse, doc_start_);  // (n, Hq) this rank's heads
    tp_.row_parallel_matmul(be, atty, *p_.o, true, res1, "the attention output", fp8_);  // (m, C)
    be.add(res1, x, res1);                                                    // residual 1
    be.rmsnorm_forward(res1, p_.norm2->compute(), eps, n2, rstd2);
    if (moe_) {  // the experts: under tp every rank routes the group's rows and runs its share of each expert
      const Tensor n2_all = tp_.all_rows(be, n2, "the sequence-parallel all-gather of post_attention_layernorm");
      tp_.sum_rows(be, y, n, "the experts' output",  // (m, C)
                   [&](Tensor& part) { moe_->forward(be, n2_all, part, &s.t[kCount]); });  // (n, C) partial over tp
      be.add(y, res1, y);                                                     // residual 2
      return;
    }
    // gate and up (n, F) column-parallel; with the collective matmul chunk by chunk as post_attention_layernorm's
    // rows arrive
    gather_rows_matmul(
        be, tp_, tp_.collective_matmul(fp8_), n2, "the sequence-parallel all-gather of post_attention_layernorm",
        [&](int64_t r0, const Tensor& rows) {
          Tensor g = gate.rows(r0, rows.size(0)), u = up.rows(r0, rows.size(0));  // (rows, F) each
          fp8_.linear(be, rows, *p_.gate, Tensor(), g);
          fp8_.linear(be, rows, *p_.up, Tensor(), u);
        });
    be.swiglu_forward(gate, up, h);                                           // (n, F)
    tp_.row_parallel_matmul(be, h, *p_.down, true, y, "the MLP output", fp8_);  // (m, C)
    be.add(y, res1, y);                                                       // residual 2
  }

  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor g_res1 = v(kGRes1), g_gate = v(kGGate), g_up = v(kGUp), g_n2 = v(kGN2), g_q = v(kGQ), g_k = v(kGK),
           g_v = v(kGV), g_n1 = v(kGN1);
    if (moe_) {
      const Tensor dy_all = tp_.all_rows(be, dy, "the sequence-parallel all-gather of the output gradient");  // (n, C)
      tp_.sum_rows(be, g_n2, n, "the experts' input-gradient",  // (m, C) d n2
                   [&](Tensor& part) { moe_->backward_input(be, dy_all, part, &s.t[kCount]); });  // (n, C) partial
    } else {
      // (n, F) d h, into d gate's buffer; with the collective matmul chunk by chunk as the output gradient's rows
      // arrive
      const Tensor dy_all = gather_rows_matmul(  // (n, C)
          be, tp_, tp_.collective_matmul(fp8_), dy, "the sequence-parallel all-gather of the output gradient",
          [&](int64_t r0, const Tensor& d) {
            Tensor out = g_gate.rows(r0, d.size(0));  // (rows, F)
            fp8_.matmul(be, d, *p_.down, false, out);
          });
      if (ring_weights_early()) down_weight_grad(be, dy_all, s, m, n);
      be.swiglu_backward(g_gate, v(kGate), v(kUp), g_gate, g_up);             // (n, F) d gate, d up
      sum_over_tp(be, {{g_gate, p_.gate}, {g_up, p_.up}}, g_n2, "the MLP input-gradient",  // (m, C) d n2
                  v(kN2), "the sequence-parallel all-gather of post_attention_layernorm",
                  [&](const Tensor& n2_all) { gate_up_weight_grads(be, n2_all, v(kGGate), v(kGUp)); });
    }
    Tensor tmp = g_n1;                                                        // (m, C) scratch
    be.rmsnorm_backward_input(g_n2, v(kRes1), p_.norm2->compute(), v(kRstd2), tmp);
    be.add(dy, tmp, g_res1);                                                  // (m, C) d res1
    const int64_t Hq = H_ * hd_;
    Tensor g_atty = s.t[kGAtty].size(0) > 0 ? v(kGAtty)                        // (n, Hq) scratch
                                             : g_n1.view({m * spec_.in}).rows(0, n * Hq).view({n, Hq});
    // (n, Hq) d atty; with the collective matmul chunk by chunk as d res1's rows arrive
    const Tensor g_res1_all = gather_rows_matmul(  // (n, C)
        be, tp_, tp_.collective_matmul(fp8_), g_res1, "the sequence-parallel all-gather of d res1",
        [&](int64_t r0, const Tensor& d) {
          Tensor out = g_atty.rows(r0, d.size(0));  // (rows, Hq)
          fp8_.matmul(be, d, *p_.o, false, out);
        });
    if (ring_weights_early()) weight_grad(be, g_res1_all, v(kAtty), *p_.o);
    // With q_norm / k_norm the attention's q and k gradients are the normalised ones' (kept for the norms' weights).
    Tensor g_qa = spec_.qk_norm ? v(kGQn) : g_q, g_ka = spec_.qk_norm ? v(kGKn) : g_k;
    if (cp_attn_)
      cp_attn_->backward(be, g_atty, v(kQ), v(kK), v(kV), v(kAtty), s.t[kLse].rows(0, n), T, H_, KV_, q_pos_,
                         doc_start_, g_qa, g_ka, g_v);
    else
      be.flash_attention_gqa_backward(g_atty, v(kQ), v(kK), v(kV), v(kAtty), s.t[kLse].rows(0, n), n / T, T, H_,
                                      KV_, g_qa, g_ka, g_v, doc_start_);
    be.rope(g_qa, T, hd_, spec_.rope_theta, 0, /*inverse=*/true, g_qa, positions_);  // d q before the rotation
    be.rope(g_ka, T, hd_, spec_.rope_theta, 0, /*inverse=*/true, g_ka, positions_);
    if (spec_.qk_norm) {  // (n H, hd) rows: d q_proj's output from d q_norm's
      Tensor gq = heads(g_q, H_), gk = heads(g_k, KV_);
      be.rmsnorm_backward_input(heads(g_qa, H_), heads(v(kQraw), H_), p_.q_norm->compute(), flat(v(kRstdQ)), gq);
      be.rmsnorm_backward_input(heads(g_ka, KV_), heads(v(kKraw), KV_), p_.k_norm->compute(), flat(v(kRstdK)), gk);
    }
    sum_over_tp(be, {{g_q, p_.q}, {g_k, p_.k}, {g_v, p_.v}}, g_n1, "the attention input-gradient",  // (m, C)
                v(kN1), "the sequence-parallel all-gather of input_layernorm",
                [&](const Tensor& n1_all) { qkv_weight_grads(be, n1_all, v(kGQ), v(kGK), v(kGV)); });
    be.rmsnorm_backward_input(g_n1, x, p_.norm1->compute(), v(kRstd1), dx);
    be.add(dx, g_res1, dx);                                                   // residual 1
  }

  // B and W together with the asynchronous input-gradient all-reduce (tp_.async_input_grads()): gate and up's, and
  // q, k and v's weight gradients are computed inside backward_input, while their input gradients' all-reduces travel
  // (not the experts': their input gradient is all-reduced in today's order).
  bool weights_in_backward() const override { return tp_.async_input_grads(); }
  // Inside backward() with sequence parallelism's collective matmuls: down's and o's weight gradients right after the
  // ring that gathered their output gradients' rows, from those rows, instead of gathering them again in
  // backward_weight, where that gather waited with nothing beside it. The same GEMMs on the same operands: the same
  // bits.
  bool ring_weights_early() const { return early_weights_ && tp_.collective_matmul(fp8_); }
  // down's weight gradient from the output gradient's rows dy_all (n, C): h (n, F) recomputed from the kept gate and
  // up (a micro-batch does not keep it from its forward).
  void down_weight_grad(Backend& be, const Tensor& dy_all, BlockSaved& s, int64_t m, int64_t n) {
    Tensor h = view(s, kH, m, n);  // (n, F)
    be.swiglu_forward(view(s, kGate, m, n), view(s, kUp, m, n), h);
    weight_grad(be, dy_all, h, *p_.down);
  }

  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    const bool sp = tp_.sequence_parallel();
    if (sp) norm_grads_.begin(be);
    Tensor dnorm1 = sp ? norm_grads_.part(0) : p_.norm1->grad, dnorm2 = sp ? norm_grads_.part(1) : p_.norm2->grad;
    // Under sequence parallelism each operand of (n) rows is gathered when it is needed (one buffer at a time).
    if (moe_) {
      moe_->backward_weight(be, tp_.all_rows(be, v(kN2), "the sequence-parallel all-gather of post_attention_layernorm"),
                            &s.t[kCount]);
    } else {
      if (!ring_weights_early())
        down_weight_grad(be, tp_.all_rows(be, dy, "the sequence-parallel all-gather of the output gradient"), s, m, n);
      if (!early_weights_)
        gate_up_weight_grads(
            be, tp_.all_rows(be, v(kN2), "the sequence-parallel all-gather of post_attention_layernorm"), v(kGGate),
            v(kGUp));
    }
    be.rmsnorm_backward_weight(v(kGN2), v(kRes1), v(kRstd2), dnorm2);
    if (!ring_weights_early())
      weight_grad(be, tp_.all_rows(be, v(kGRes1), "the sequence-parallel all-gather of d res1"), v(kAtty), *p_.o);
    if (!early_weights_)
      qkv_weight_grads(be, tp_.all_rows(be, v(kN1), "the sequence-parallel all-gather of input_layernorm"), v(kGQ),
                       v(kGK), v(kGV));
    if (spec_.qk_norm) {  // under tp each rank's heads give part of q_norm's and k_norm's gradients: summed over tp
      if (tp_.on()) qk_grads_.begin(be);
      Tensor dq = tp_.on() ? qk_grads_.part(0) : p_.q_norm->grad, dk = tp_.on() ? qk_grads_.part(1) : p_.k_norm->grad;
      be.rmsnorm_backward_weight(heads(v(kGQn), H_), heads(v(kQraw), H_), flat(v(kRstdQ)), dq);
      be.rmsnorm_backward_weight(heads(v(kGKn), KV_), heads(v(kKraw), KV_), flat(v(kRstdK)), dk);
      if (tp_.on()) qk_grads_.finish(be, tp_, {&p_.q_norm->grad, &p_.k_norm->grad});
    }
    be.rmsnorm_backward_weight(v(kGN1), x, v(kRstd1), dnorm1);
    if (sp) norm_grads_.finish(be, tp_, {&p_.norm1->grad, &p_.norm2->grad});
  }

  void take_router_stats(std::vector<RouterStats>& out) override {
    if (moe_) moe_->take_stats(out);
  }
  void set_expert_bias(Backend& be, const std::vector<float>& bias) override {
    if (moe_) moe_->set_bias(be, bias.data() + spec_.moe.layer * spec_.moe.n_experts);
  }

  // Generation: key and value caches (n, max_len, KV hd) and one position's intermediates.
  enum : size_t { dK, dV, dN, dRstd, dQ, dKn, dVn, dAtty, dRes, dGate, dUp, dH, dQraw, dKraw, dRstdQ, dRstdK, dCount };
  bool can_decode() const override { return !tp_.on() && !ep_on_; }
  void allocate_decode(Backend& be, int64_t n, int64_t max_len, BlockSaved& c) override {
    const int64_t C = spec_.in, Hq = H_ * hd_, Hkv = KV_ * hd_, qk = spec_.qk_norm ? n : 0;
    const DType a = spec_.dtype;
    allocate_buffers(be, {{{n, max_len, Hkv}, a}, {{n, max_len, Hkv}, a}, {{n, C}, a}, {{n}, DType::f32},
                          {{n, Hq}, a}, {{n, Hkv}, a}, {{n, Hkv}, a}, {{n, Hq}, a}, {{n, C}, a},
                          {{n, F_}, a}, {{n, F_}, a}, {{n, F_}, a}, {{qk, Hq}, a}, {{qk, Hkv}, a}, {{qk, H_}, DType::f32},
                          {{qk, KV_}, DType::f32}}, c.t);
    if (moe_) {  // the experts' buffers for n rows after the decode set
      std::vector<Tensor> m;
      allocate_buffers(be, MoeMlp::saved_shapes(spec_, n), m);
      for (Tensor& t : m) c.t.push_back(t);
    }
  }
  DecodeCache decode_cache() const override {
    const int64_t b = 2 * KV_ * hd_ * int64_t(dtype_size(spec_.dtype));
    return {b, b, cat("2 x ", KV_, " key/value heads x ", hd_)};
  }
  // x, y (n, C) at position t, attending over the cached positions.
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t t, BlockSaved& c) override {
    Tensor &nrm = c.t[dN], &rstd = c.t[dRstd], &q = c.t[dQ], &k = c.t[dKn], &val = c.t[dVn], &atty = c.t[dAtty];
    Tensor &res = c.t[dRes], &gate = c.t[dGate], &up = c.t[dUp], &h = c.t[dH];
    const float eps = float(spec_.eps);
    be.rmsnorm_forward(x, p_.norm1->compute(), eps, nrm, rstd);
    QkNorm qkn;
    if (spec_.qk_norm) qkn = {c.t[dQraw], c.t[dKraw], c.t[dRstdQ], c.t[dRstdK]};
    attention_inputs(be, nrm, q, k, val, 1, t, qkn, Fp8Linear());     // one position per sequence: t
    be.attention_decode_gqa(q, k, val, c.t[dK], c.t[dV], t, H_, KV_, atty);
    be.linear(atty, p_.o->compute(), Tensor(), res);
    be.add(res, x, res);                                                // residual 1
    be.rmsnorm_forward(res, p_.norm2->compute(), eps, nrm, rstd);
    if (moe_) {
      moe_->forward(be, nrm, y, &c.t[dCount]);                          // (n, C)
      be.add(y, res, y);
      return;
    }
    be.linear(nrm, p_.gate->compute(), Tensor(), gate);
    be.linear(nrm, p_.up->compute(), Tensor(), up);
    be.swiglu_forward(gate, up, h);                                     // (n, F)
    be.linear(h, p_.down->compute(), Tensor(), y);
    be.add(y, res, y);                                                  // residual 2
  }

 private:
  // Saved buffer k for a micro-batch of n rows of which this rank holds m (row-wise buffers: local()).
  static Tensor view(BlockSaved& s, size_t k, int64_t m, int64_t n) { return s.t[k].rows(0, local(k) ? m : n); }
  // out (m, C) = sum over the projections (g_i (n, w_i), W_i (w_i, C)) of g_i @ W_i, and over the tp group: a
  // column-parallel input's gradient (TensorParallel::column_input_grad; early_weights_: the sum travels while
  // weights(x_all) computes the projections' weight gradients from their input rows x, gathered under sequence
  // parallelism).
  void sum_over_tp(Backend& be, std::initializer_list<std::pair<Tensor, Param*>> terms, Tensor& out, const char* of,
                   const Tensor& x, const char* gather_what, const std::function<void(const Tensor& x_all)>& weights) {
    const int64_t n = terms.begin()->first.size(0);
    tp_.column_input_grad(be, out, n, of, [&](Tensor& sums) {  // (n, C) partial over tp
      float beta = 0.f;
      for (const auto& [g_i, w] : terms) {
        fp8_.matmul(be, g_i, *w, false, sums, beta);
        beta = 1.f;
      }
    }, early_weights_, x, gather_what, weights);
  }
  // The column-parallel projections' weight gradients from their input (n, C) (gathered under sequence parallelism):
  // gate's and up's from d gate, d up (n, F); q's, k's and v's from d q (n, Hq), d k, d v (n, Hkv).
  void gate_up_weight_grads(Backend& be, const Tensor& n2_all, const Tensor& g_gate, const Tensor& g_up) const {
    weight_grad(be, g_gate, n2_all, *p_.gate);
    weight_grad(be, g_up, n2_all, *p_.up);
  }
  void qkv_weight_grads(Backend& be, const Tensor& n1_all, const Tensor& g_q, const Tensor& g_k,
                        const Tensor& g_v) const {
    weight_grad(be, g_q, n1_all, *p_.q);
    weight_grad(be, g_k, n1_all, *p_.k);
    weight_grad(be, g_v, n1_all, *p_.v);
  }
  // Qwen3's per-head norms' buffers: q_proj's and k_proj's outputs (n, Hq), (n, Hkv) and their rstds (n, H), (n, KV).
  struct QkNorm {
    Tensor qraw, kraw, rstd_q, rstd_k;
  };
  // x (n, heads x hd) as (n heads, hd) rows, one per head; a rstd (n, heads) as (n heads).
  Tensor heads(const Tensor& x, int64_t h) const { return x.view({x.size(0) * h, hd_}); }
  static Tensor flat(const Tensor& r) { return r.view({r.numel()}); }
  // q (n, Hq), k, v (n, Hkv) = the projections of n1 (n, C), q and k RMS-normalised per head when spec.qk_norm (qk
  // holds the norms' inputs and rstds); q and k rotated for rows at positions pos0 + r % T, or at positions_
  // (restarting with each document) when set.
  void attention_inputs(Backend& be, const Tensor& n1, Tensor& q, Tensor& k, Tensor& v, int64_t T, int64_t pos0,
                        QkNorm& qk, const Fp8Linear& gemm) {
    qkv_projections(be, n1, q, k, v, qk, gemm);
    qkv_finish(be, q, k, T, pos0, qk);
  }
  // The projections of rows of n1 into the same rows of q (or qk.qraw under qk_norm), k (or qk.kraw) and v: row by
  // row, so the collective matmul runs them a chunk at a time.
  void qkv_projections(Backend& be, const Tensor& n1, Tensor& q, Tensor& k, Tensor& v, QkNorm& qk,
                       const Fp8Linear& gemm) {
    gemm.linear(be, n1, *p_.q, Tensor(), spec_.qk_norm ? qk.qraw : q);
    gemm.linear(be, n1, *p_.k, Tensor(), spec_.qk_norm ? qk.kraw : k);
    gemm.linear(be, n1, *p_.v, Tensor(), v);
  }
  // q and k from the projections: per-head RMS-normalised under qk_norm, then rotated.
  void qkv_finish(Backend& be, Tensor& q, Tensor& k, int64_t T, int64_t pos0, QkNorm& qk) {
    if (spec_.qk_norm) {
      const float eps = float(spec_.eps);
      Tensor qh = heads(q, H_), kh = heads(k, KV_), rq = flat(qk.rstd_q), rk = flat(qk.rstd_k);
      be.rmsnorm_forward(heads(qk.qraw, H_), p_.q_norm->compute(), eps, qh, rq);
      be.rmsnorm_forward(heads(qk.kraw, KV_), p_.k_norm->compute(), eps, kh, rk);
    }
    be.rope(q, T, hd_, spec_.rope_theta, pos0, /*inverse=*/false, q, positions_);
    be.rope(k, T, hd_, spec_.rope_theta, pos0, /*inverse=*/false, k, positions_);
  }

  // dW (out, in) += dy^T @ x
  void weight_grad(Backend& be, const Tensor& dy, const Tensor& x, Param& w) const {
    fp8_.weight_grad(be, dy, x, w.grad);
  }

  LlamaParams p_{};
  TensorParallel tp_;
  int64_t hd_, H_, KV_, F_;  // head size; this rank's query heads, key/value heads and SwiGLU units
  std::shared_ptr<CpAttention> cp_attn_;  // parallel.cp > 1: the rank's shared one
  SpNormGrads norm_grads_;  // sequence parallelism: the two RMSNorm weights' gradients
  SpNormGrads qk_grads_;    // tensor parallelism with q_norm / k_norm: their gradients from this rank's heads
  bool ep_on_ = false;           // its experts split over ranks (generation runs them all on one)
  std::unique_ptr<MoeMlp> moe_;  // spec.moe on: the experts instead of gate, up and down
  Fp8Linear fp8_;  // q, k, v, o, gate, up and down's GEMMs: FP8 under train.precision = "fp8" (not the experts')
};

}  // namespace

std::vector<BufferSpec> llama_saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  return spec.kind == BlockKind::llama_layer ? LlamaLayer::saved_shapes(spec, rows, tp) : std::vector<BufferSpec>{};
}

std::unique_ptr<Block> make_llama_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                        const ContextParallel& cp, const ExpertParallel& ep) {
  RELAY_ASSERT(spec.kind == BlockKind::llama_layer, "make_llama_block: not a Llama layer: " << block_kind_name(spec.kind));
  return std::make_unique<LlamaLayer>(spec, std::move(params), tp, cp, ep);
}

}  // namespace relay
