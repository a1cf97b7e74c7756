// DeepSeek-V3's dense decoder layer with multi-head latent attention (MLA: DeepSeek-V2, arXiv:2405.04434 sec. 2.1;
// DeepSeek-V3, arXiv:2412.19437 sec. 2.1.1; transformers' DeepseekV3Attention and DeepseekV3DecoderLayer are the
// reference modules):
//   q       = q_b_proj(q_a_layernorm(q_a_proj(n1)))  or q_proj(n1)       (n, H (dn + dr)), n1 = input_layernorm(x)
//   latent  = kv_a_layernorm(kv_a_proj_with_mqa(n1)[:, :r]),  k_pe = kv_a_proj_with_mqa(n1)[:, r:]   (n, r), (n, dr)
//   [k_nope_h | v_h] = kv_b_proj(latent) per head                           (n, H (dn + dv))
//   q_h = [q_nope_h | rope(q_pe_h)],  k_h = [k_nope_h | rope(k_pe)]        one rotary key per token, every head's
//   h = x + o_proj(attention(q, k, v)),  y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),  n2 = post_attention_layernorm(h)
// or, in the routed-expert layers (spec.moe on: transformers' DeepseekV3MoE), y = h + MoeMlp(n2) (model/moe.hpp:
// sigmoid scores, group-limited top-k, shared experts; expert parallelism there).
// Attention is FlashAttention-2 with value heads narrower than query/key heads (dv against dn + dr), scale
// qk_scale / sqrt(dn + dr) (qk_scale: YaRN's mscale^2, folded into the queries; the rotary tables YaRN's then too).
// rope_interleave (transformers' default): the rotary pairs are columns (2i, 2i + 1) of the rope
// part, and the rotated part is laid out [evens | odds] as transformers' apply_rotary_pos_emb_interleave writes it;
// only q . k enters attention, so the layouts need only agree between q and k.
//
// Tensor parallelism (Megatron-LM): each tp rank holds H / tp heads (q_b_proj or q_proj, and kv_b_proj, split by
// output rows; o_proj row-parallel), and F / tp SwiGLU units; q_a_proj, kv_a_proj_with_mqa and the three norms are
// replicated. The backward all-reduces the heads' partial gradients of the small tensors the replicated part produced
// (q_a_layernorm's output, the latent, k_pe), after which every rank computes the replicated weights' gradients whole
// and alike. Context parallelism (model/context_parallel.hpp) gathers the heads' keys and values as Llama's layer does
// (the rotary parts at each row's position in its sequence).
// Sequence parallelism (Korthikanti et al., arXiv:2205.05198; as Llama's layer): the layer's input and output are this
// rank's n / tp rows; input_layernorm's output is all-gathered once, before the replicated a-projections and the
// column-parallel q_proj, so everything from the a-projections on sees all n rows, and the a-projections' and their
// norms' weight gradients come out whole on every rank (no group sum), as under plain tp. d input_layernorm: the
// replicated terms are whole on every rank (this rank's rows taken), q_proj's partial term is reduce-scattered. o_proj
// and the MLP's down projection (the experts' output) reduce-scatter; input_layernorm's and post_attention_layernorm's
// weights see this rank's rows only, their gradients summed over the group (SpNormGrads).
// Generation (decode) keeps MLA's compressed cache, the normalised latent and the rotated rotary key per position, and
// attends in the absorbed form (DeepSeek-V2 sec. 2.1.2): see decode() below.
// Under train.precision = "fp8" every linear GEMM goes through Fp8Linear (kv_a_proj_with_mqa as two GEMMs, its latent
// rows and its rotary-key rows, each quantised on its own).
#include "model/blocks.hpp"
#include "model/collective_matmul.hpp"
#include "model/fp8_linear.hpp"
#include "model/moe.hpp"

namespace relay {

namespace {

class MlaLayer final : public Block {
 public:
  MlaLayer(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp, const ContextParallel& cp,
           const ExpertParallel& ep)
      : Block(spec, std::move(params)), tp_(tp), m_(spec.mla), H_(spec.n_head / tp.size),
        F_(spec.moe.on() ? 0 : spec.ffn_hidden / tp.size), cp_attn_(cp.on() ? cp.attention : nullptr),
        ep_on_(ep.on()), fp8_(fp8_linear(spec, tp.comm)) {
    RELAY_ASSERT(tp.sequence_parallel() == (spec.sp > 1), "mla layer: sequence parallelism disagrees");
    const bool ql = m_.q_lora_rank > 0;
    // norm1, [q_a, q_a_norm, q_b | q], kv_a, kv_a_norm, kv_b, o, norm2, then gate, up, down or the MoE's (moe.hpp)
    const size_t attn = ql ? 9 : 7;
    const size_t want = attn + (spec.moe.on() ? MoeMlp::param_count(spec.moe, ep) : 3);
    RELAY_ASSERT(params_.size() == want, "mla layer: " << params_.size() << " params, expected " << want);
    size_t i = 0;
    norm1_ = params_[i++];
    if (ql) q_a_ = params_[i++], q_a_norm_ = params_[i++], q_b_ = params_[i++];
    else q_ = params_[i++];
    kv_a_ = params_[i++], kv_a_norm_ = params_[i++], kv_b_ = params_[i++], o_ = params_[i++];
    norm2_ = params_[i++];
    if (spec.moe.on()) moe_ = std::make_unique<MoeMlp>(spec, std::span<Param* const>(params_).subspan(attn), ep, tp, cp);
    else gate_ = params_[i++], up_ = params_[i++], down_ = params_[i++];
  }

  // saved.t: the forward's intermediates, then (backward) the gradients backward_input leaves for backward_weight, then
  // scratch. Widths are this tp rank's: H heads, F SwiGLU units (0 in a MoE layer, whose buffers follow from kCount,
  // MoeMlp::saved_shapes'). With q_lora_rank 0 the q_a buffers have 0 rows.
  enum : size_t { kN1, kRstd1, kQa, kRstdQa, kQaN, kLat, kRstdLat, kLatN, kQ, kK, kV, kLse, kAtty, kRes1, kN2,
                  kRstd2, kGate, kUp, kH, kGRes1, kGGate, kGUp, kGN2, kGQ, kGK, kGV, kGKv, kGQaN, kGQa, kGLatN, kGLat,
                  kGPe, kGN1, kGAtty, kKv, kPe, kKpe, kAll, kCount };
  // Under sequence parallelism the row-wise buffers (local()) hold this rank's m = n / tp rows.
  static bool local(size_t k) {
    return k == kN1 || k == kRstd1 || k == kRes1 || k == kN2 || k == kRstd2 || k == kGRes1 || k == kGN2 || k == kGN1;
  }
  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n, int tp) {
    const MlaSpec& m = spec.mla;
    const int64_t C = spec.in, H = spec.n_head / tp, F = spec.moe.on() ? 0 : spec.ffn_hidden / tp;
    const int64_t dqk = m.qk_head(), dr = m.qk_rope, rows = n / spec.sp;
    const int64_t r = m.kv_lora_rank, ql = m.q_lora_rank, nq = ql > 0 ? n : 0;
    const DType a = spec.dtype, f32 = DType::f32;
    std::vector<BufferSpec> s(kCount);
    s[kN1] = {{rows, C}, a};
    s[kRstd1] = {{rows}, f32};
    s[kQa] = {{nq, ql}, a};            // q_a_proj's output
    s[kRstdQa] = {{nq}, f32};
    s[kQaN] = {{nq, ql}, a};           // q_a_layernorm's output
    s[kLat] = {{n, r}, a};             // kv_a_proj_with_mqa's latent columns
    s[kRstdLat] = {{n}, f32};
    s[kLatN] = {{n, r}, a};            // kv_a_layernorm's output
    s[kQ] = {{n, H * dqk}, a};         // [q_nope | rotated q_pe] per head
    s[kK] = {{n, H * dqk}, a};         // [k_nope | rotated k_pe] per head
    s[kV] = {{n, H * m.v_head}, a};
    s[kLse] = {{n, H}, f32};           // (B, H, T) for n = B x T rows
    s[kAtty] = {{n, H * m.v_head}, a};
    s[kRes1] = {{rows, C}, a};
    s[kN2] = {{rows, C}, a};
    s[kRstd2] = {{rows}, f32};
    s[kGate] = {{n, F}, a};
    s[kUp] = {{n, F}, a};
    s[kH] = {{n, F}, a, true};         // scratch: the SwiGLU output, recomputed for down's weight gradient
    s[kGRes1] = {{rows, C}, a, true};
    s[kGGate] = {{n, F}, a, true};
    s[kGUp] = {{n, F}, a, true};
    s[kGN2] = {{rows, C}, a, true};
    s[kGQ] = {{n, H * dqk}, a, true};  // d q_b_proj's (q_proj's) output
    s[kGK] = {{n, H * dqk}, a, true};
    s[kGV] = {{n, H * m.v_head}, a, true};
    s[kGKv] = {{n, H * (m.qk_nope + m.v_head)}, a, true};  // d kv_b_proj's output
    s[kGQaN] = {{nq, ql}, a, true};
    s[kGQa] = {{nq, ql}, a, true};
    s[kGLatN] = {{n, r}, a, true};
    s[kGLat] = {{n, r}, a, true};
    s[kGPe] = {{n, dr}, a, true};      // d k_pe before the rotation
    s[kGN1] = {{rows, C}, a, true};
    s[kGAtty] = {{n, H * m.v_head}, a, true};
    s[kKv] = {{n, H * (m.qk_nope + m.v_head)}, a, true};  // scratch: kv_b_proj's output
    s[kPe] = {{n, H * dr}, a, true};   // scratch: the heads' rotary parts, contiguous
    s[kKpe] = {{n, dr}, a, true};      // scratch: k_pe, then its gradient's terms
    // scratch (sequence parallelism with experts): the gathered post_attention_layernorm output, then output gradient,
    // apart from the shared buffer the experts' partial sums go to (MoeMlp reads its input after writing its output)
    s[kAll] = {{spec.moe.on() && spec.sp > 1 ? n : 0, C}, a, true};
    if (spec.moe.on())
      for (const BufferSpec& b : MoeMlp::saved_shapes(spec, n, tp)) s.push_back(b);
    return s;
  }
  void allocate_saved(Backend& be, int64_t n, BlockSaved& s) override {
    allocate_buffers(be, saved_shapes(spec_, n, tp_.size), s);
    if (tp_.sequence_parallel()) norm_grads_.allocate(be, spec_.in);
  }

  // x, y (m, C): m = n rows, or this rank's n / tp under sequence parallelism.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len, dqk = m_.qk_head(), dn = m_.qk_nope;
    const int64_t dr = m_.qk_rope, dv = m_.v_head, r = m_.kv_lora_rank, w_kv = dn + dv;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor n1 = v(kN1), q = v(kQ), k = v(kK), val = v(kV), kv = v(kKv), pe = v(kPe), kpe = v(kKpe), atty = v(kAtty);
    Tensor rstd1 = v(kRstd1), lat = v(kLat), latn = v(kLatN), rstd_lat = v(kRstdLat), lse = s.t[kLse].rows(0, n);
    const float eps = float(spec_.eps);
    be.rmsnorm_forward(x, norm1_->compute(), eps, n1, rstd1);                      // (m, C)
    // The projections of n1's rows (rows, C), rows [r0, r0 + rows) of the micro-batch's: q_a's (or q's), the
    // latent's and k_pe's. Under sequence parallelism n1's (n, C) rows are gathered into the shared buffer first, or
    // with overlap chunk by chunk as they arrive (the collective matmul).
    const Tensor w_kva = kv_a_->compute();                                          // (r + dr, C)
    Tensor qa = q_a_ ? v(kQa) : Tensor();  // (n, ql) with a query latent
    auto project = [&](int64_t r0, const Tensor& rows) {
      const int64_t k_rows = rows.size(0);
      Tensor out_q = q_a_ ? qa.rows(r0, k_rows) : q.rows(r0, k_rows), out_lat = lat.rows(r0, k_rows);
      Tensor out_kpe = kpe.rows(r0, k_rows);
      fp8_.linear(be, rows, q_a_ ? *q_a_ : *q_, Tensor(), out_q);                 // (rows, ql) or (rows, H dqk)
      fp8_.linear(be, rows, w_kva.rows(0, r), Tensor(), out_lat);                 // (rows, r)
      fp8_.linear(be, rows, w_kva.rows(r, dr), Tensor(), out_kpe);                // (rows, dr) k_pe
    };
    gather_rows_matmul(be, tp_, tp_.collective_matmul(fp8_), n1, "the sequence-parallel all-gather of input_layernorm",
                       project);
    // Queries: (n, H dqk), [q_nope | q_pe] per head.
    if (q_a_) {
      Tensor qan = v(kQaN), rstd_qa = v(kRstdQa);
      be.rmsnorm_forward(qa, q_a_norm_->compute(), eps, qan, rstd_qa);             // (n, ql)
      fp8_.linear(be, qan, *q_b_, Tensor(), q);                                // (n, H dqk) this rank's heads
    }
    rope_part(be, q, H_, dqk, dn, pe, T, /*backward=*/false);                      // q_pe rotated in place
    if (m_.qk_scale != 1.0) be.scale(q, float(m_.qk_scale));                       // the softmax's mscale^2
    // Keys and values from the latent and the one shared rotary key.
    be.rmsnorm_forward(lat, kv_a_norm_->compute(), eps, latn, rstd_lat);
    rope_part(be, kpe, 1, dr, 0, pe.view({n * H_ * dr}).rows(0, n * dr).view({n, dr}), T, false);  // rotated
    fp8_.linear(be, latn, *kv_b_, Tensor(), kv);                           // (n, H (dn + dv))
    // kv (n, H w_kv) and k (n, H dqk), val (n, H dv) read as one row per (token, head): two copies for every head.
    Tensor kv_h = kv.view({n * H_, w_kv}), k_h = k.view({n * H_, dqk}), val_h = val.view({n * H_, dv});
    be.copy_columns(kv_h, 0, k_h, 0, dn);                                          // k_nope (n H, dn)
    be.copy_columns(kv_h, dn, val_h, 0, dv);                                       // v (n H, dv)
    for (int64_t h = 0; h < H_; ++h) be.copy_columns(kpe, 0, k, h * dqk + dn, dr);  // the shared rotary key
    if (cp_attn_)  // context parallelism: this rank's chunks against the group's gathered keys and values
      cp_attn_->forward(be, q, k, val, T, H_, H_, q_pos_, doc_start_, atty, lse);  // (n, H dv)
    else
      be.flash_attention_gqa_forward(q, k, val, n / T, T, H_, H_, atty, lse, doc_start_);  // (n, H dv)
    Tensor res1 = v(kRes1), n2 = v(kN2), rstd2 = v(kRstd2), gate = v(kGate), up = v(kUp), hid = v(kH);
    tp_.row_parallel_matmul(be, atty, *o_, true, res1, "the attention output", fp8_);  // (m, C)
    be.add(res1, x, res1);                                                         // residual 1
    be.rmsnorm_forward(res1, norm2_->compute(), eps, n2, rstd2);                   // (m, C)
    if (moe_) {  // under tp every rank routes all rows and runs its share of each expert's units
      const Tensor n2_all = gathered(be, s, n2, n, "the sequence-parallel all-gather of post_attention_layernorm");
      tp_.sum_rows(be, y, n, "the experts' output",  // (m, C)
                   [&](Tensor& part) { moe_->forward(be, n2_all, part, &s.t[kCount]); });  // (n, C) partial over tp
      be.add(y, res1, y);                                                          // residual 2
      return;
    }
    auto gate_up = [&](int64_t r0, const Tensor& rows) {  // (rows, C) -> gate, up's same rows (rows, F), column-parallel
      Tensor g = gate.rows(r0, rows.size(0)), u = up.rows(r0, rows.size(0));
      fp8_.linear(be, rows, *gate_, Tensor(), g);
      fp8_.linear(be, rows, *up_, Tensor(), u);
    };
    gather_rows_matmul(be, tp_, tp_.collective_matmul(fp8_), n2,
                       "the sequence-parallel all-gather of post_attention_layernorm", gate_up);
    be.swiglu_forward(gate, up, hid);                                              // (n, F)
    tp_.row_parallel_matmul(be, hid, *down_, true, y, "the MLP output", fp8_);  // (m, C)
    be.add(y, res1, y);                                                            // residual 2
  }

  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, T = spec_.seq_len, dqk = m_.qk_head(), dn = m_.qk_nope;
    const int64_t dr = m_.qk_rope, dv = m_.v_head, r = m_.kv_lora_rank, w_kv = dn + dv;
    const bool sp = tp_.sequence_parallel();
    auto v = [&](size_t k) { return view(s, k, m, n); };
    Tensor g_res1 = v(kGRes1), g_gate = v(kGGate), g_up = v(kGUp), g_n2 = v(kGN2), g_n1 = v(kGN1);
    // The MLP: d n2 (m, C), summed over tp (reduce-scattered under sequence parallelism).
    if (moe_) {
      const Tensor dy_all = gathered(be, s, dy, n, "the sequence-parallel all-gather of the output gradient");
      tp_.sum_rows(be, g_n2, n, "the experts' input-gradient",  // (m, C) d n2
                   [&](Tensor& part) { moe_->backward_input(be, dy_all, part, &s.t[kCount]); });  // (n, C) partial
    } else {
      const Tensor dy_all = tp_.all_rows(be, dy, "the sequence-parallel all-gather of the output gradient");  // (n, C)
      fp8_.matmul(be, dy_all, *down_, false, g_gate, 0.f);         // (n, F) d h
      be.swiglu_backward(g_gate, v(kGate), v(kUp), g_gate, g_up);                  // (n, F) d gate, d up
      // (m, C) d n2 (no early weights under sequence parallelism: weights_in_backward())
      auto partial = [&](Tensor& sums) {  // (n, C) partial over tp
        fp8_.matmul(be, g_gate, *gate_, false, sums, 0.f);
        fp8_.matmul(be, g_up, *up_, false, sums, 1.f);
      };
      auto weights = [&](const Tensor& n2_all) {
        weight_grad(be, v(kGGate), n2_all, gate_->grad);
        weight_grad(be, v(kGUp), n2_all, up_->grad);
      };
      tp_.column_input_grad(be, g_n2, n, "the MLP input-gradient", partial, early_weights_, v(kN2),
                            "the sequence-parallel all-gather of post_attention_layernorm", weights);
    }
    be.rmsnorm_backward_input(g_n2, v(kRes1), norm2_->compute(), v(kRstd2), g_n1);  // g_n1: scratch here
    be.add(dy, g_n1, g_res1);                                                      // (m, C) d res1
    // Attention.
    Tensor g_atty = v(kGAtty), g_q = v(kGQ), g_k = v(kGK), g_v = v(kGV), g_kv = v(kGKv), pe = v(kPe);
    const Tensor g_res1_all = tp_.all_rows(be, g_res1, "the sequence-parallel all-gather of d res1");  // (n, C)
    fp8_.matmul(be, g_res1_all, *o_, false, g_atty, 0.f);          // (n, H dv)
    if (cp_attn_)
      cp_attn_->backward(be, g_atty, v(kQ), v(kK), v(kV), v(kAtty), s.t[kLse].rows(0, n), T, H_, H_, q_pos_,
                         doc_start_, g_q, g_k, g_v);
    else
      be.flash_attention_gqa_backward(g_atty, v(kQ), v(kK), v(kV), v(kAtty), s.t[kLse].rows(0, n), n / T, T, H_,
                                      H_, g_q, g_k, g_v, doc_start_);
    if (m_.qk_scale != 1.0) be.scale(g_q, float(m_.qk_scale));                     // d q before the mscale^2
    rope_part(be, g_q, H_, dqk, dn, pe, T, /*backward=*/true);                     // d q before the rotation
    // d k_pe: the heads' rotary-key gradients summed (this rank's heads; all-reduced below), then un-rotated.
    Tensor g_pe = v(kGPe), term = v(kKpe);
    be.copy_columns(g_k, dn, g_pe, 0, dr);
    for (int64_t h = 1; h < H_; ++h) {  // heads in order: the sum's order as before
      be.copy_columns(g_k, h * dqk + dn, term, 0, dr);
      be.add(g_pe, term, g_pe);
    }
    Tensor g_kv_h = g_kv.view({n * H_, w_kv});  // one row per (token, head), as the forward's kv_h
    be.copy_columns(g_k.view({n * H_, dqk}), 0, g_kv_h, 0, dn);                    // d k_nope (n H, dn)
    be.copy_columns(g_v.view({n * H_, dv}), 0, g_kv_h, dn, dv);                    // d v (n H, dv)
    tp_.allreduce_sum(g_pe, "the rotary key's gradient all-reduce");
    rope_part(be, g_pe, 1, dr, 0, pe.view({n * H_ * dr}).rows(0, n * dr).view({n, dr}), T, true);
    // The latent: d kv_a_layernorm's output (partial over the heads), then its input.
    Tensor g_latn = v(kGLatN), g_lat = v(kGLat);
    fp8_.matmul(be, g_kv, *kv_b_, false, g_latn, 0.f);             // (n, r)
    input_grad_sum(g_latn, "the latent's gradient all-reduce", [&] { weight_grad(be, g_kv, v(kLatN), kv_b_->grad); });
    be.rmsnorm_backward_input(g_latn, v(kLat), kv_a_norm_->compute(), v(kRstdLat), g_lat);
    // d n1 (m, C): the query path's term (partial over tp without q_lora_rank), then the replicated kv_a terms. Those
    // are whole on every rank (d q_a, d latent and d k_pe were all-reduced), so under sequence parallelism each rank
    // takes its own rows of them.
    const int64_t r0 = sp ? tp_.rank * m : 0;
    auto mine = [&](const Tensor& t) { return t.rows(r0, m); };  // (n, w) -> this rank's (m, w)
    if (q_a_) {
      Tensor g_qan = v(kGQaN), g_qa = v(kGQa);
      fp8_.matmul(be, g_q, *q_b_, false, g_qan, 0.f);              // (n, ql) partial over the heads
      input_grad_sum(g_qan, "the query latent's gradient all-reduce",
                     [&] { weight_grad(be, g_q, v(kQaN), q_b_->grad); });
      be.rmsnorm_backward_input(g_qan, v(kQa), q_a_norm_->compute(), v(kRstdQa), g_qa);
      fp8_.matmul(be, mine(g_qa), *q_a_, false, g_n1, 0.f);        // (m, C)
    } else {
      tp_.column_input_grad(  // (m, C)
          be, g_n1, n, "the attention input-gradient",
          [&](Tensor& sums) { fp8_.matmul(be, g_q, *q_, false, sums, 0.f); },  // (n, C) partial over tp
          early_weights_, v(kN1), "the sequence-parallel all-gather of input_layernorm",
          [&](const Tensor& n1_all) { weight_grad(be, g_q, n1_all, q_->grad); });
    }
    const Tensor w_kva = kv_a_->compute();
    fp8_.matmul(be, mine(g_lat), w_kva.rows(0, r), false, g_n1, 1.f);
    fp8_.matmul(be, mine(g_pe), w_kva.rows(r, dr), false, g_n1, 1.f);
    be.rmsnorm_backward_input(g_n1, x, norm1_->compute(), v(kRstd1), dx);
    be.add(dx, g_res1, dx);                                                        // residual 1
  }

  // B and W together with the asynchronous input-gradient all-reduce (tp_.async_input_grads()): gate and up's, kv_b's
  // and q_b's (or q's) weight gradients are computed inside backward_input while the all-reduces of their inputs'
  // gradients travel (the experts' and k_pe's all-reduces stay in today's order).
  bool weights_in_backward() const override { return tp_.async_input_grads() && !tp_.sequence_parallel(); }

  void backward_weight(Backend& be, const Tensor& x, const Tensor& dy, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, r = m_.kv_lora_rank, dr = m_.qk_rope;
    auto v = [&](size_t k) { return view(s, k, m, n); };
    const bool sp = tp_.sequence_parallel();
    if (sp) norm_grads_.begin(be);
    Tensor dnorm1 = sp ? norm_grads_.part(0) : norm1_->grad, dnorm2 = sp ? norm_grads_.part(1) : norm2_->grad;
    // Under sequence parallelism each operand of (n) rows is gathered when it is needed (one buffer at a time).
    if (moe_) {
      moe_->backward_weight(be, tp_.all_rows(be, v(kN2), "the sequence-parallel all-gather of post_attention_layernorm"),
                            &s.t[kCount]);
    } else {
      Tensor hid = v(kH);  // (n, F) recomputed from the kept gate and up
      be.swiglu_forward(v(kGate), v(kUp), hid);
      weight_grad(be, tp_.all_rows(be, dy, "the sequence-parallel all-gather of the output gradient"), hid, down_->grad);
      if (!early_weights_) {
        const Tensor n2_all = tp_.all_rows(be, v(kN2), "the sequence-parallel all-gather of post_attention_layernorm");
        weight_grad(be, v(kGGate), n2_all, gate_->grad);
        weight_grad(be, v(kGUp), n2_all, up_->grad);
      }
    }
    be.rmsnorm_backward_weight(v(kGN2), v(kRes1), v(kRstd2), dnorm2);
    weight_grad(be, tp_.all_rows(be, v(kGRes1), "the sequence-parallel all-gather of d res1"), v(kAtty), o_->grad);
    if (!early_weights_) weight_grad(be, v(kGKv), v(kLatN), kv_b_->grad);
    be.rmsnorm_backward_weight(v(kGLatN), v(kLat), v(kRstdLat), kv_a_norm_->grad);
    // The replicated a-projections from every row (whole d latent, d k_pe, d q_a on every rank): whole and alike.
    const Tensor n1_all = tp_.all_rows(be, v(kN1), "the sequence-parallel all-gather of input_layernorm");  // (n, C)
    Tensor g_kva = kv_a_->grad.rows(0, r + dr);
    Tensor g_lat_w = g_kva.rows(0, r), g_pe_w = g_kva.rows(r, dr);
    weight_grad(be, v(kGLat), n1_all, g_lat_w);
    weight_grad(be, v(kGPe), n1_all, g_pe_w);
    if (q_a_) {
      if (!early_weights_) weight_grad(be, v(kGQ), v(kQaN), q_b_->grad);
      be.rmsnorm_backward_weight(v(kGQaN), v(kQa), v(kRstdQa), q_a_norm_->grad);
      weight_grad(be, v(kGQa), n1_all, q_a_->grad);
    } else if (!early_weights_) {
      weight_grad(be, v(kGQ), n1_all, q_->grad);
    }
    be.rmsnorm_backward_weight(v(kGN1), x, v(kRstd1), dnorm1);
    if (sp) norm_grads_.finish(be, tp_, {&norm1_->grad, &norm2_->grad});
  }
  void take_router_stats(std::vector<RouterStats>& out) override {
    if (moe_) moe_->take_stats(out);
  }
  void set_expert_bias(Backend& be, const std::vector<float>& bias) override {
    if (moe_) moe_->set_bias(be, bias.data() + spec_.moe.layer * spec_.moe.n_experts);
  }

  // Generation with the compressed cache (DeepSeek-V2 sec. 2.1.2; vLLM's MLA decode): per position only the
  // normalised latent c_kv (r) and the rotated shared rotary key k_pe (dr), never the heads' keys and values. The
  // absorbed form: q_nope_h . k_nope_h = q_nope_h . (W_UK_h c) = (q_nope_h W_UK_h) . c, so each head's query is taken
  // into the latent space (q_latent_h (r) = q_nope_h (dn) @ W_UK_h (dn, r)) and scored against the cached latents
  // directly; the attention-weighted latent (r) goes back out through W_UV_h (dv, r) to the head's value width.
  // W_UK_h and W_UV_h are kv_b_proj's rows [h (dn + dv), + dn) and [h (dn + dv) + dn, + dv).
  // Buffers (n sequences, one position each), then from dCount the experts' (MoeMlp::saved_shapes):
  enum : size_t { dCache, dN1, dRstd1, dQa, dRstdQa, dQaN, dQ, dPe, dLat, dRstdLat, dLatN, dKpe, dKv, dQn, dQl, dQabs,
                  dOlat, dAtty, dRes, dN2, dRstd2, dGate, dUp, dH, dCount };

 public:
  bool can_decode() const override { return !tp_.on() && !ep_on_; }
  void allocate_decode(Backend& be, int64_t n, int64_t max_len, BlockSaved& c) override {
    const int64_t C = spec_.in, dqk = m_.qk_head(), dn = m_.qk_nope, dr = m_.qk_rope, dv = m_.v_head;
    const int64_t r = m_.kv_lora_rank, ql = m_.q_lora_rank, nq = ql > 0 ? n : 0;
    const DType a = spec_.dtype, f32 = DType::f32;
    allocate_buffers(be, {{{n, max_len, r + dr}, a},  // the compressed cache: [c_kv | rotated k_pe] per position
                          {{n, C}, a}, {{n}, f32},    // input_layernorm
                          {{nq, ql}, a}, {{nq}, f32}, {{nq, ql}, a},  // q_a_proj, q_a_layernorm
                          {{n, H_ * dqk}, a},         // q: [q_nope | rotated q_pe] per head
                          {{n * H_, dr}, a},          // rope scratch: a rotary part per (sequence, head)
                          {{n, r}, a}, {{n}, f32}, {{n, r}, a},  // the latent, kv_a_layernorm's rstd and output
                          {{n, dr}, a},               // k_pe
                          {{n, r + dr}, a},           // this position's cache row
                          {{n * H_, dn}, a},          // q_nope per (sequence, head)
                          {{n * H_, r}, a},           // q_latent per (sequence, head)
                          {{n, H_ * (r + dr)}, a},    // the absorbed queries [q_latent | q_pe] per head
                          {{n, H_ * r}, a},           // the attention-weighted latents per head
                          {{n, H_ * dv}, a},          // the heads' outputs through W_UV, o_proj's input
                          {{n, C}, a}, {{n, C}, a}, {{n}, f32},  // residual 1, post_attention_layernorm
                          {{n, F_}, a}, {{n, F_}, a}, {{n, F_}, a}}, c.t);  // the dense SwiGLU
    if (moe_) {
      std::vector<Tensor> m;
      allocate_buffers(be, MoeMlp::saved_shapes(spec_, n), m);
      for (Tensor& t : m) c.t.push_back(t);
    }
  }
  DecodeCache decode_cache() const override {
    const int64_t b = int64_t(dtype_size(spec_.dtype));
    return {(m_.kv_lora_rank + m_.qk_rope) * b, H_ * (m_.qk_head() + m_.v_head) * b,
            cat("(", m_.kv_lora_rank, " latent + ", m_.qk_rope, " rotary key)")};
  }
  // x, y (n, C) at position t, attending over the cached positions [0, t].
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t t, BlockSaved& c) override {
    const int64_t dqk = m_.qk_head(), dn = m_.qk_nope, dr = m_.qk_rope, dv = m_.v_head, r = m_.kv_lora_rank;
    const int64_t w_kv = dn + dv;
    const float eps = float(spec_.eps);
    Tensor &n1 = c.t[dN1], &q = c.t[dQ], &pe = c.t[dPe], &kpe = c.t[dKpe], &kv = c.t[dKv], &qn = c.t[dQn];
    Tensor &ql = c.t[dQl], &qabs = c.t[dQabs], &olat = c.t[dOlat], &atty = c.t[dAtty];
    Tensor &res = c.t[dRes], &n2 = c.t[dN2];
    const int64_t n = x.size(0);
    be.rmsnorm_forward(x, norm1_->compute(), eps, n1, c.t[dRstd1]);                 // (n, C)
    if (q_a_) {
      be.linear(n1, q_a_->compute(), Tensor(), c.t[dQa]);                            // (n, ql)
      be.rmsnorm_forward(c.t[dQa], q_a_norm_->compute(), eps, c.t[dQaN], c.t[dRstdQa]);
      be.linear(c.t[dQaN], q_b_->compute(), Tensor(), q);                            // (n, H dqk)
    } else {
      be.linear(n1, q_->compute(), Tensor(), q);                                     // (n, H dqk)
    }
    rope_at(be, q.view({n * H_, dqk}), dn, pe, t);                                  // q_pe rotated at t
    // This position's cache row: the normalised latent and the rotated shared rotary key.
    const Tensor w_kva = kv_a_->compute();                                            // (r + dr, C)
    be.linear(n1, w_kva.rows(0, r), Tensor(), c.t[dLat]);                             // (n, r)
    be.rmsnorm_forward(c.t[dLat], kv_a_norm_->compute(), eps, c.t[dLatN], c.t[dRstdLat]);
    be.linear(n1, w_kva.rows(r, dr), Tensor(), kpe);                                  // (n, dr)
    rope_at(be, kpe, 0, pe.rows(0, n), t);
    be.copy_columns(c.t[dLatN], 0, kv, 0, r);
    be.copy_columns(kpe, 0, kv, r, dr);                                               // (n, r + dr)
    // The absorbed queries: q_latent_h = q_nope_h @ W_UK_h (one grouped GEMM per sequence, a head a group), next to
    // the head's rotated q_pe. Rows (sequence, head) of q, qabs and the outputs are views (n H, width).
    const Tensor w_kvb = kv_b_->compute();                                            // (H (dn + dv), r)
    std::vector<Tensor> w_uk, w_uv;
    std::vector<int64_t> heads;
    for (int64_t h = 0; h < H_; ++h) {
      w_uk.push_back(w_kvb.rows(h * w_kv, dn));                                       // (dn, r)
      w_uv.push_back(w_kvb.rows(h * w_kv + dn, dv));                                  // (dv, r)
      heads.push_back(h);
    }
    heads.push_back(H_);                                                              // group h: row h
    const Tensor qh = q.view({n * H_, dqk});
    Tensor qabs_h = qabs.view({n * H_, r + dr}), olat_h = olat.view({n * H_, r}), atty_h = atty.view({n * H_, dv});
    be.copy_columns(qh, 0, qn, 0, dn);                                                // (n H, dn)
    for (int64_t b = 0; b < n; ++b) {
      Tensor ql_b = ql.rows(b * H_, H_);
      be.grouped_matmul(qn.rows(b * H_, H_), w_uk, false, ql_b, heads, 0.f);          // (H, r)
    }
    be.copy_columns(ql, 0, qabs_h, 0, r);
    be.copy_columns(qh, dn, qabs_h, r, dr);                                           // (n H, r + dr)
    // The softmax scale of the materialised form: 1 / sqrt(dn + dr), times YaRN's mscale^2.
    const float scale = float(m_.qk_scale / std::sqrt(double(dqk)));
    be.attention_decode_latent(qabs, kv, c.t[dCache], t, H_, scale, olat);           // (n, H r)
    for (int64_t b = 0; b < n; ++b) {  // each head's value: its weighted latent through W_UV_h
      Tensor atty_b = atty_h.rows(b * H_, H_);
      be.grouped_matmul(olat_h.rows(b * H_, H_), w_uv, true, atty_b, heads, 0.f);     // (H, dv)
    }
    be.linear(atty, o_->compute(), Tensor(), res);                                    // (n, C)
    be.add(res, x, res);                                                              // residual 1
    be.rmsnorm_forward(res, norm2_->compute(), eps, n2, c.t[dRstd2]);
    if (moe_) {  // the training forward on the rows: sigmoid router, group-limited top-k, shared experts
      moe_->forward(be, n2, y, &c.t[dCount]);                                         // (n, C)
      be.add(y, res, y);
      return;
    }
    be.linear(n2, gate_->compute(), Tensor(), c.t[dGate]);
    be.linear(n2, up_->compute(), Tensor(), c.t[dUp]);
    be.swiglu_forward(c.t[dGate], c.t[dUp], c.t[dH]);                                 // (n, F)
    be.linear(c.t[dH], down_->compute(), Tensor(), y);
    be.add(y, res, y);                                                                // residual 2
  }

 private:
  // Saved buffer k for a micro-batch of n rows of which this rank holds m (row-wise buffers: local()).
  static Tensor view(BlockSaved& s, size_t k, int64_t m, int64_t n) {
    return s.t[k].rows(0, std::min(local(k) ? m : n, s.t[k].size(0)));
  }
  // local (m, C) -> every row (n, C): under sequence parallelism gathered, then copied out of the shared buffer into
  // kAll (the experts write their partial sums to the shared buffer while still reading their input); else local.
  Tensor gathered(Backend& be, BlockSaved& s, const Tensor& local, int64_t n, const char* what) const {
    if (!tp_.sequence_parallel()) return local;
    Tensor all = s.t[kAll].rows(0, n);
    be.copy(all, tp_.gather_rows(be, local, what));
    return all;
  }
  // dW (out, in) += dy^T @ x
  void weight_grad(Backend& be, const Tensor& dy, const Tensor& x, Tensor& dw) const { fp8_.weight_grad(be, dy, x, dw); }
  // The latents' gradients (kv_b's and q_b's input gradients, n rows on every rank, sequence parallelism or not),
  // partial over the heads, all-reduced in place; in backward() the sum travels while `weights` computes the
  // projection's weight gradients (which backward_weight then skips). (q's and gate, up's: column_input_grad.)
  void input_grad_sum(Tensor& t, const char* what, const std::function<void()>& weights) const {
    if (early_weights_) tp_.allreduce_sum_during(t, what, weights);
    else tp_.allreduce_sum(t, what);
  }
  // The rotary part of each of `heads` heads of x (n, heads w): columns [off, off + dr) of each, rotated in place
  // through pe (n, heads dr) scratch. Forward: read in transformers' pairing (interleaved: evens then odds), rotate,
  // write back contiguous halves. Backward (x a gradient of the rotated layout): read the halves, rotate back, write
  // in the input's pairing.
  void rope_part(Backend& be, Tensor& x, int64_t heads, int64_t w, int64_t off, Tensor pe, int64_t T,
                 bool backward) const {
    const int64_t dr = m_.qk_rope;
    RELAY_ASSERT(x.size(1) == heads * w, "mla rope_part: x has " << x.size(1) << " columns, expected " << heads * w);
    // Forward reads the input layout (interleaved pairs with rope_interleave); backward reads the rotated
    // (contiguous halves) layout and writes the input's pairing.
    be.gather_rotary(x, w, off, m_.rope_interleave && !backward, pe);
    be.rope(pe, T, dr, spec_.rope_theta, 0, /*inverse=*/backward, pe, positions_, m_.rope_scaling);
    be.scatter_rotary(pe, w, off, m_.rope_interleave && backward, x);
  }

  // Decode's rotation: the rotary part, columns [off, off + dr), of every row of x (rows, w) at position pos, through
  // pe (rows, dr) scratch; read in transformers' pairing, written back as contiguous halves, as rope_part's forward.
  // Rows may be (sequence, head) pairs: one position for all of them.
  void rope_at(Backend& be, Tensor x, int64_t off, Tensor pe, int64_t pos) const {
    const int64_t dr = m_.qk_rope;
    be.gather_rotary(x, x.size(1), off, m_.rope_interleave, pe);
    be.rope(pe, 1, dr, spec_.rope_theta, pos, /*inverse=*/false, pe, Tensor(), m_.rope_scaling);
    be.scatter_rotary(pe, x.size(1), off, /*interleaved=*/false, x);
  }

  TensorParallel tp_;
  MlaSpec m_;
  int64_t H_, F_;  // this rank's heads and SwiGLU units
  std::shared_ptr<CpAttention> cp_attn_;  // parallel.cp > 1: the rank's shared one
  bool ep_on_ = false;  // its experts split over ranks (generation runs them all on one)
  Fp8Linear fp8_;  // q_a, q_b (or q), kv_a, kv_b, o, gate, up and down's GEMMs: FP8 under train.precision = "fp8"
  SpNormGrads norm_grads_;  // sequence parallelism: input_layernorm's and post_attention_layernorm's gradients
  Param *norm1_ = nullptr, *q_ = nullptr, *q_a_ = nullptr, *q_a_norm_ = nullptr, *q_b_ = nullptr, *kv_a_ = nullptr,
        *kv_a_norm_ = nullptr, *kv_b_ = nullptr, *o_ = nullptr, *norm2_ = nullptr, *gate_ = nullptr, *up_ = nullptr,
        *down_ = nullptr;
  std::unique_ptr<MoeMlp> moe_;  // spec.moe on: DeepSeek-V3's experts instead of gate, up and down
};

}  // namespace

std::vector<BufferSpec> mla_saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  return spec.kind == BlockKind::mla_layer ? MlaLayer::saved_shapes(spec, rows, tp) : std::vector<BufferSpec>{};
}

std::unique_ptr<Block> make_mla_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                      const ContextParallel& cp, const ExpertParallel& ep) {
  RELAY_ASSERT(spec.kind == BlockKind::mla_layer, "make_mla_block: not an MLA layer: " << block_kind_name(spec.kind));
  return std::make_unique<MlaLayer>(spec, std::move(params), tp, cp, ep);
}

}  // namespace relay
