// DeepSeek-V3's multi-token prediction (MTP; DeepSeek-AI, arXiv:2412.19437 section 2.2; the layer names and the
// [embedding; hidden] concatenation order of the official checkpoints and of vLLM's deepseek_mtp.py), as one block
// between the last decoder layer and the head. Its main path is the identity (the head reads the same h^0); beside it:
//   h^0 = the block's input (the final hidden states before model.norm)                          (n, C)
//   module k = 1..D:  e_k = Emb(t_{i+k}),  h'_k = eh_proj([enorm(e_k); hnorm(h^{k-1})])          (n, C), (n, 2C) -> (n, C)
//                     h^k = TransformerBlock_k(h'_k),  logits_k = shared_head(h^k)               (n, C), (n, V)
//                     CE_k over the positions i whose i + k lies in i's sequence and document (target t_{i+k+1})
// shared_head is shared_head.norm then the model's output weight, Emb the model's embedding (one parameter each with
// the main model's: their gradients are the sums). The loss adds weight / D x sum_k CE_k, CE_k the mean over the
// global batch's counted positions of depth k (MtpBatch::counted), so each module's CE gradient is computed here, in
// the forward, as the main loss's is after the head (model/loss.hpp). The shift is Megatron-LM's roll_tensor within
// each sequence and document (model/documents.hpp, shift_targets): a position whose i + k crosses its sequence's or
// document's end reads id 0 and predicts nothing (target -1); causal attention within the document (the main layers'
// document mask) keeps it out of every counted position. Under context parallelism every rank holds the micro-batch's
// whole sequences' targets: the block shifts them whole and keeps its own rows (cp_position), and its decoder layers'
// attention runs through the cp group as the main layers' does. Under tensor parallelism the
// block's transformer splits as a decoder layer does, eh_proj and the norms are replicated, the shared embedding and
// head are vocabulary-parallel with a vocabulary-parallel cross-entropy. Under sequence parallelism the block's input
// and output are this rank's n / tp rows: it gathers h^0 once and runs its modules on every row as under plain tp (their
// inner blocks without sequence parallelism), so its weights' gradients come out whole on every rank; d h^0 (whole on
// every rank) gives this rank's rows of dx. Under expert parallelism a routed-expert decoder layer's experts are split
// over the ep group as the main layers' are (every ep rank of the last stage runs the block; its dispatches pair up).
#include <algorithm>

#include "model/blocks.hpp"
#include "model/documents.hpp"
#include "model/loss.hpp"

namespace relay {

namespace {

class MtpBlock final : public Block {
 public:
  // Own buffers of module k, then its transformer block's and its head's (their allocate_saved lists), module by module.
  enum : size_t { kIds, kE, kCat, kRstdE, kRstdH, kHp, kHk, kLogits, kGHk, kGHp, kGCat, kGE, kGPrev, kTmp, kH0,
                  kOwn };

  // params: the spec's, of a routed-expert decoder layer this ep rank's experts only (model_spec.cpp's make_block).
  MtpBlock(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp, const ContextParallel& cp,
           const ExpertParallel& ep)
      : Block(spec, std::move(params)), tp_(tp), inner_tp_(tp), cp_(cp) {
    RELAY_ASSERT(tp.sequence_parallel() == (spec.sp > 1), "mtp block: sequence parallelism disagrees");
    inner_tp_.sp_rows = nullptr;  // the modules run on every row
    const int64_t D = spec.mtp.depth;
    RELAY_ASSERT(int64_t(spec.inner.size()) == 3 * D, "mtp block: " << spec.inner.size() << " inner blocks for " << D);
    size_t i = 2;  // params: embedding, output weight, then per module enorm, hnorm, eh_proj, shared_head.norm, layer
    for (int64_t k = 0; k < D; ++k) {
      Module m;
      m.enorm = params_[i++], m.hnorm = params_[i++], m.eh_proj = params_[i++];
      Param* head_norm = params_[i++];
      const BlockSpec& ls = spec.inner[size_t(3 * k)];
      size_t held = 0;  // the layer's parameters this rank holds
      for (size_t j = 0; j < ls.params.size(); ++j) held += ep.holds(ls, j) ? 1 : 0;
      std::vector<Param*> lp(params_.begin() + std::ptrdiff_t(i), params_.begin() + std::ptrdiff_t(i + held));
      i += held;
      m.layer = make_mla_block(ls, std::move(lp), inner_tp_, cp, ep);
      m.head = make_gpt_block(spec.inner[size_t(3 * k + 1)], {head_norm, params_[1]}, inner_tp_);
      m.embed = make_gpt_block(spec.inner[size_t(3 * k + 2)], {params_[0]}, inner_tp_);
      offsets_.push_back(offset_);
      offset_ += kOwn + mla_saved_shapes(ls, 1, tp.size).size() + gpt_saved_shapes(spec.inner[size_t(3 * k + 1)], 1, tp.size).size();
      modules_.push_back(std::move(m));
    }
    RELAY_ASSERT(i == params_.size(), "mtp block: " << params_.size() << " params, used " << i);
    sums_.assign(size_t(D), 0.0);
  }

  static std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t n, int tp) {
    std::vector<BufferSpec> all;
    for (int64_t k = 0; k < spec.mtp.depth; ++k) {
      const BlockSpec &ls = spec.inner[size_t(3 * k)], &hs = spec.inner[size_t(3 * k + 1)];
      for (const BufferSpec& b : own_shapes(spec, n, tp, 0)) all.push_back(b);
      for (BufferSpec b : mla_saved_shapes(ls, n, tp)) b.backward = false, all.push_back(b);
      for (BufferSpec b : gpt_saved_shapes(hs, n, tp)) b.backward = false, all.push_back(b);
    }
    return all;
  }

  // Every buffer the block's own (none shared with other blocks): its modules run all their backward_input before
  // their backward_weight.
  void allocate_saved(Backend& be, int64_t n, BlockSaved& s) override {
    s.t.clear();
    const int64_t V = spec_.inner[1].out;
    for (Module& m : modules_) {
      BlockSaved own, layer, head;
      allocate_buffers(be, own_shapes(spec_, n, tp_.size, tp_.rank), own);
      m.layer->allocate_saved(be, n, layer);
      m.head->allocate_saved(be, n, head);
      for (BlockSaved* b : {&own, &layer, &head}) s.t.insert(s.t.end(), b->t.begin(), b->t.end());
      if (!m.loss)
        m.loss = std::make_unique<Loss>(be, LossKind::cross_entropy, m.head->out_width(), tp_,
                                        tp_begin(V, tp_.size, tp_.rank), spec_.dtype);
    }
    RELAY_ASSERT(s.t.size() == offset_, "mtp block: " << s.t.size() << " buffers, expected " << offset_);
  }

  void set_targets(const MtpBatch& batch) override { batch_ = batch; }

  // x (m, C) = h^0 -> y (m, C) = h^0 (m = n rows, or this rank's n / tp under sequence parallelism); the modules'
  // losses and their logits' gradients beside it.
  void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& s) override {
    be.copy(y, x);
    if (!batch_.targets) return;  // evaluation (or generation): the main model's prediction alone
    const int64_t n = x.size(0) * spec_.sp, T = spec_.seq_len, C = spec_.in;
    hand_documents();
    if (tp_.sequence_parallel()) {
      Tensor all = parts(s, 1, n).h0;  // (n, C)
      be.copy(all, tp_.gather_rows(be, x, "the sequence-parallel all-gather of the MTP input"));
    }
    Tensor prev = h0(x, s);  // h^{k-1} (n, C)
    for (int64_t k = 1; k <= spec_.mtp.depth; ++k) {
      Module& m = modules_[size_t(k - 1)];
      Parts p = parts(s, k, n);
      shifted_tokens(n, T, k);
      be.upload(p.ids, ids_.data());  // (n) t_{i+k}
      Tensor none;
      BlockSaved nothing;
      m.embed->forward(be, p.ids, p.e, nothing);                                     // (n, C)
      be.rmsnorm_forward(p.e, m.enorm->compute(), float(spec_.eps), p.tmp, p.rstd_e);  // (n, C)
      be.copy_columns(p.tmp, 0, p.cat, 0, C);
      be.rmsnorm_forward(prev, m.hnorm->compute(), float(spec_.eps), p.tmp, p.rstd_h);
      be.copy_columns(p.tmp, 0, p.cat, C, C);                         // (n, 2C) [enorm(e); hnorm(h)]
      be.linear(p.cat, m.eh_proj->compute(), none, p.hp);             // (n, C)
      m.layer->forward(be, p.hp, p.hk, p.layer);                      // (n, C)
      m.head->forward(be, p.hk, p.logits, p.head);                    // (n, Vl)
      Tensor tg = m.loss->targets(0, n);                              // (n) t_{i+k+1}, -1 past the document
      be.upload(tg, targets_k_.data());
      const double counted = double(batch_.counted[k - 1]);
      const float scale = counted > 0 ? float(spec_.mtp.weight / double(spec_.mtp.depth) / counted) : 0.f;
      sums_[size_t(k - 1)] += m.loss->forward_backward(0, p.logits, p.logits, scale);  // d logits in place
      prev = p.hk;
    }
    batch_ = MtpBatch();
  }

  // dx (m, C) = dy + d h^0 through module 1's hnorm (each module's d h^k: its own CE's, plus module k + 1's; whole on
  // every rank, of which this rank's rows under sequence parallelism).
  void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& s) override {
    const int64_t m = x.size(0), n = m * spec_.sp, C = spec_.in;
    hand_documents();
    for (int64_t k = spec_.mtp.depth; k >= 1; --k) {
      Module& m = modules_[size_t(k - 1)];
      Parts p = parts(s, k, n);
      m.head->backward_input(be, p.hk, p.logits, p.g_hk, p.head);  // (n, C) from CE_k
      if (k < spec_.mtp.depth) {
        Tensor later = parts(s, k + 1, n).g_prev;  // d h^k from module k + 1
        be.add(p.g_hk, later, p.g_hk);
      }
      m.layer->backward_input(be, p.hp, p.g_hk, p.g_hp, p.layer);       // (n, C)
      be.matmul(p.g_hp, false, m.eh_proj->compute(), false, p.g_cat, 1.f, 0.f);  // (n, C) @ (C, 2C)
      be.copy_columns(p.g_cat, 0, p.tmp, 0, C);                              // d enorm(e)
      be.rmsnorm_backward_input(p.tmp, p.e, m.enorm->compute(), p.rstd_e, p.g_e);
      be.copy_columns(p.g_cat, C, p.tmp, 0, C);                              // d hnorm(h^{k-1})
      be.rmsnorm_backward_input(p.tmp, k == 1 ? h0(x, s) : parts(s, k - 1, n).hk, m.hnorm->compute(), p.rstd_h,
                                p.g_prev);
    }
    be.add(dy, parts(s, 1, n).g_prev.rows(tp_.sequence_parallel() ? tp_.rank * m : 0, m), dx);
  }

  void backward_weight(Backend& be, const Tensor& x, const Tensor&, BlockSaved& s) override {
    const int64_t n = x.size(0) * spec_.sp, C = spec_.in;
    hand_documents();
    for (int64_t k = 1; k <= spec_.mtp.depth; ++k) {
      Module& m = modules_[size_t(k - 1)];
      Parts p = parts(s, k, n);
      m.head->backward_weight(be, p.hk, p.logits, p.head);
      m.layer->backward_weight(be, p.hp, p.g_hk, p.layer);
      be.matmul(p.g_hp, true, p.cat, false, m.eh_proj->grad, 1.f, 1.f);  // (C, n) @ (n, 2C)
      be.copy_columns(p.g_cat, 0, p.tmp, 0, C);
      be.rmsnorm_backward_weight(p.tmp, p.e, p.rstd_e, m.enorm->grad);
      be.copy_columns(p.g_cat, C, p.tmp, 0, C);
      be.rmsnorm_backward_weight(p.tmp, k == 1 ? h0(x, s) : parts(s, k - 1, n).hk, p.rstd_h, m.hnorm->grad);
      BlockSaved nothing;
      m.embed->backward_weight(be, p.ids, p.g_e, nothing);
    }
  }

  void take_mtp_stats(std::vector<double>& sums) override {
    if (sums.size() < sums_.size()) sums.resize(sums_.size(), 0.0);
    for (size_t k = 0; k < sums_.size(); ++k) sums[k] += sums_[k], sums_[k] = 0;
  }
  // The modules' routers take no part in the run's router statistics, load balancing or expert bias (docs/models.md).
  void take_router_stats(std::vector<RouterStats>&) override {
    std::vector<RouterStats> dropped;
    for (Module& m : modules_) m.layer->take_router_stats(dropped);
  }

  // Generation predicts with the main model alone.
  bool can_decode() const override { return true; }
  void decode(Backend& be, const Tensor& x, Tensor& y, int64_t, BlockSaved&) override { be.copy(y, x); }

 private:
  struct Module {
    Param *enorm = nullptr, *hnorm = nullptr, *eh_proj = nullptr;
    std::unique_ptr<Block> layer, head, embed;
    std::unique_ptr<Loss> loss;
  };
  // Module k's views for a micro-batch of n rows (Vl: this tp rank's vocabulary columns).
  struct Parts {
    Tensor ids;              // i32 (n) t_{i+k}, 0 past the sequence
    Tensor e, hp, hk;        // (n, C) Emb(t_{i+k}), h'_k = eh_proj(cat), h^k
    Tensor cat;              // (n, 2C) [enorm(e); hnorm(h^{k-1})]
    Tensor rstd_e, rstd_h;   // f32 (n) the two norms' 1 / rms
    Tensor logits;           // (n, Vl) shared_head(h^k), then (the loss writes over them) d logits
    Tensor g_hk, g_hp, g_e;  // (n, C) d h^k (its CE's and module k + 1's), d h'_k, d e
    Tensor g_cat;            // (n, 2C) d cat
    Tensor g_prev;           // (n, C) d h^{k-1} through hnorm
    Tensor tmp;              // (n, C) scratch: a norm's output, a half of d cat
    Tensor h0;               // (n, C) module 1's: h^0 gathered under sequence parallelism (0 rows without)
    BlockSaved layer, head;  // the decoder layer's and the shared head's own buffers
  };
  // Module buffers on tp rank r (its vocabulary shard's logits).
  static std::vector<BufferSpec> own_shapes(const BlockSpec& spec, int64_t n, int tp, int r) {
    const DType a = spec.dtype, f32 = DType::f32, i32 = DType::i32;
    const int64_t C = spec.in, V = spec.inner[1].out, Vl = tp_end(V, tp, r) - tp_begin(V, tp, r);
    std::vector<BufferSpec> b(kOwn);
    b[kIds] = {{n}, i32};
    b[kE] = b[kHp] = b[kHk] = b[kGHk] = b[kGHp] = b[kGE] = b[kGPrev] = b[kTmp] = {{n, C}, a};
    b[kCat] = b[kGCat] = {{n, 2 * C}, a};
    b[kRstdE] = b[kRstdH] = {{n}, f32};
    b[kLogits] = {{n, Vl}, a};  // the logits, then (the loss writes over them) their gradient
    b[kH0] = {{spec.sp > 1 ? n : 0, C}, a};
    return b;
  }
  Parts parts(BlockSaved& s, int64_t k, int64_t n) const {
    const size_t at = offsets_[size_t(k - 1)];
    const size_t l = mla_saved_shapes(spec_.inner[size_t(3 * (k - 1))], 1, tp_.size).size();
    const size_t h = (k < spec_.mtp.depth ? offsets_[size_t(k)] : offset_) - at - kOwn - l;
    const auto v = [&](size_t i) { return s.t[at + i].rows(0, n); };
    Parts p;
    p.ids = v(kIds), p.e = v(kE), p.cat = v(kCat), p.rstd_e = v(kRstdE), p.rstd_h = v(kRstdH), p.hp = v(kHp);
    p.hk = v(kHk), p.logits = v(kLogits), p.g_hk = v(kGHk);
    p.g_hp = v(kGHp), p.g_cat = v(kGCat), p.g_e = v(kGE), p.g_prev = v(kGPrev), p.tmp = v(kTmp);
    p.h0 = s.t[at + kH0].rows(0, std::min(n, s.t[at + kH0].size(0)));
    p.layer.t.assign(s.t.begin() + std::ptrdiff_t(at + kOwn), s.t.begin() + std::ptrdiff_t(at + kOwn + l));
    p.head.t.assign(s.t.begin() + std::ptrdiff_t(at + kOwn + l), s.t.begin() + std::ptrdiff_t(at + kOwn + l + h));
    return p;
  }
  // Module k's inputs t_{i+k} and targets t_{i+k+1} of this rank's n rows (0 and -1 where i + k crosses the sequence
  // or document), shifted on the micro-batch's whole sequences; under cp this rank's rows of each (cp_position).
  void shifted_tokens(int64_t n, int64_t T, int64_t k) {
    const int64_t local = T / cp_.size, samples = n / local;  // local: a sequence's rows on this rank
    RELAY_ASSERT(samples * local == n, "mtp block: " << n << " rows are not whole sequences of " << local);
    ids_.resize(size_t(samples * T));
    targets_k_.resize(size_t(samples * T));
    shift_targets(batch_.targets, batch_.doc_start, samples * T, T, k, ids_.data(), targets_k_.data());
    if (!cp_.on()) return;
    for (int64_t s = 0; s < samples; ++s)  // in place: row s x local + j <= its source s x T + position
      for (int64_t j = 0; j < local; ++j) {
        const size_t from = size_t(s * T + cp_position(T, cp_.size, cp_.rank, j)), to = size_t(s * local + j);
        ids_[to] = ids_[from];
        targets_k_[to] = targets_k_[from];
      }
  }

  // The micro-batch's sequence layout (document mask, positions, places under cp: Block::set_documents) to the
  // modules' decoder layers, whose attention and rotary read it as the main layers' do (on all n rows: under sequence
  // parallelism the chunk hands every row's).
  void hand_documents() {
    for (Module& m : modules_) m.layer->set_documents(doc_start_, positions_, q_pos_);
  }

  // h^0 (n, C): the block's input x, or under sequence parallelism its gathered copy.
  Tensor h0(const Tensor& x, BlockSaved& s) const {
    return tp_.sequence_parallel() ? parts(s, 1, x.size(0) * spec_.sp).h0 : x;
  }

  TensorParallel tp_;
  TensorParallel inner_tp_;  // tp_ without sequence parallelism: the modules' blocks'
  std::vector<Module> modules_;
  ContextParallel cp_;  // the decoder layers' (their attention through the cp group); the rest is row-wise
  MtpBatch batch_;     // set_targets: this micro-batch's targets and layout, until its forward
  std::vector<int32_t> ids_, targets_k_;  // (samples x T) shifted, then (n) this rank's rows first
  std::vector<size_t> offsets_;  // module k's first buffer in BlockSaved::t is offsets_[k - 1]
  size_t offset_ = 0;            // buffers in all
  std::vector<double> sums_;  // per module, the training micro-batches' sum of CE_k since take_mtp_stats
};

}  // namespace

std::vector<BufferSpec> mtp_saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  return spec.kind == BlockKind::mtp ? MtpBlock::saved_shapes(spec, rows, tp) : std::vector<BufferSpec>{};
}

std::unique_ptr<Block> make_mtp_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                      const ContextParallel& cp, const ExpertParallel& ep) {
  RELAY_ASSERT(spec.kind == BlockKind::mtp, "make_mtp_block: not an MTP block: " << block_kind_name(spec.kind));
  return std::make_unique<MtpBlock>(spec, std::move(params), tp, cp, ep);
}

}  // namespace relay
