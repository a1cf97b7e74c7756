#include "model/context_parallel.hpp"

#include "core/error.hpp"
#include "core/memory.hpp"
#include "comm/trace.hpp"

namespace relay {

void CpAttention::prepare(Backend& be, int64_t n, int64_t T, int64_t w, int64_t wv, DType dt) {
  const int64_t cp = size_, rows = cp * n;
  const bool same = w == w_ && wv == wv_ && dt == dt_;
  const bool fits = rank_order_.defined() && rows <= rank_order_.size(0) && same;
  if (!fits) {  // first use, a larger batch, other widths: allocate
    MemoryScope scope(MemKind::activations);
    const int64_t cap = std::max<int64_t>(rows, rank_order_.defined() && same ? rank_order_.size(0) : 0);
    rank_order_ = Tensor(be, {cap, std::max(w, wv)}, dt);
    k_ = Tensor(be, {cap, w}, dt);
    v_ = Tensor(be, {cap, wv}, dt);
    dk_ = Tensor(be, {cap, w}, dt);
    dv_ = Tensor(be, {cap, wv}, dt);
    to_sequence_ = Tensor(be, {cap}, DType::i32);
    to_rank_ = Tensor(be, {cap}, DType::i32);
    n_ = 0;  // the permutations are made below
    w_ = w;
    wv_ = wv;
    dt_ = dt;
  }
  if (n == n_ && T == T_) return;
  // Local row j of sequence s on rank r sits at rank-order row r n + s Tl + j and at sequence-order row s T + p.
  const int64_t Tl = T / cp, B = n / Tl;
  RELAY_ASSERT(Tl * cp == T && B * Tl == n, "context parallelism: " << n << " rows of sequences of " << T << " over "
                                                                    << cp << " ranks");
  std::vector<int32_t> to_seq(static_cast<size_t>(rows)), to_rank(static_cast<size_t>(rows));
  for (int64_t r = 0; r < cp; ++r)
    for (int64_t s = 0; s < B; ++s)
      for (int64_t j = 0; j < Tl; ++j) {
        const int64_t rank_row = r * n + s * Tl + j, seq_row = s * T + cp_position(T, int(cp), int(r), j);
        to_seq[static_cast<size_t>(seq_row)] = int32_t(rank_row);
        to_rank[static_cast<size_t>(rank_row)] = int32_t(seq_row);
      }
  Tensor ts = to_sequence_.rows(0, rows), tr = to_rank_.rows(0, rows);
  be.upload(ts, to_seq.data());
  be.upload(tr, to_rank.data());
  n_ = n;
  T_ = T;
}

void CpAttention::trace(const char* name, const char* op, int64_t begin) {
  tracer_->add({name, op, kTrackComm, trace_step_, -1, -1, begin, tracer_->mark()});
}

void CpAttention::gather(Backend& be, const Tensor& local, Tensor& full, const char* what, const char* name) {
  const int64_t m0 = tracer_ ? tracer_->mark() : 0;
  const int64_t n = local.size(0), rows = size_ * n;
  Tensor buf = rank_order(rows, local.size(1));  // (cp n, w) every rank's rows, rank after rank
  Tensor mine = buf.rows(rank_ * n, n);
  be.copy(mine, local);
  RequestPtr r = comm_->iallgather(buf);
  r->what = what;
  r->wait();
  be.gather_rows(buf, to_sequence_.rows(0, rows), full);
  if (tracer_) trace(name, "cp_allgather", m0);
}

void CpAttention::reduce_scatter(Backend& be, const Tensor& full, Tensor& local, const char* what,
                                 const char* name) {
  const int64_t m0 = tracer_ ? tracer_->mark() : 0;
  const int64_t n = local.size(0), rows = size_ * n;
  Tensor buf = rank_order(rows, local.size(1));
  be.gather_rows(full, to_rank_.rows(0, rows), buf);
  RequestPtr r = comm_->ireduce_scatter_sum(buf, local);
  r->what = what;
  r->wait();
  if (tracer_) trace(name, "cp_reduce_scatter", m0);
}

void CpAttention::forward(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int64_t T, int64_t H,
                          int64_t KV, const Tensor& q_pos, const Tensor& doc_start, Tensor& out, Tensor& lse) {
  const int64_t n = q.size(0), rows = size_ * n, Tl = T / size_;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  Tensor kf = k_.rows(0, rows), vf = v_.rows(0, rows);  // (B*T, KV*hd), (B*T, KV*hd_v) sequence order
  gather(be, k, kf, "the context-parallel key all-gather", "cp all-gather k");
  gather(be, v, vf, "the context-parallel value all-gather", "cp all-gather v");
  be.flash_attention_gqa_forward_at(q, kf, vf, n / Tl, Tl, T, q_pos, H, KV, out, lse, doc_start);
}

void CpAttention::backward(Backend& be, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& lse, int64_t T, int64_t H, int64_t KV, const Tensor& q_pos,
                           const Tensor& doc_start, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t n = q.size(0), rows = size_ * n, Tl = T / size_;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  Tensor kf = k_.rows(0, rows), vf = v_.rows(0, rows), dkf = dk_.rows(0, rows), dvf = dv_.rows(0, rows);
  gather(be, k, kf, "the context-parallel key all-gather (backward)", "cp all-gather k (backward)");
  gather(be, v, vf, "the context-parallel value all-gather (backward)", "cp all-gather v (backward)");
  be.flash_attention_gqa_backward_at(dout, q, kf, vf, out, lse, n / Tl, Tl, T, q_pos, H, KV, dq, dkf, dvf, doc_start);
  reduce_scatter(be, dkf, dk, "the context-parallel key-gradient reduce-scatter", "cp reduce-scatter dk");
  reduce_scatter(be, dvf, dv, "the context-parallel value-gradient reduce-scatter", "cp reduce-scatter dv");
}

void CpAttention::prepare_packed(Backend& be, int64_t n, int64_t w, DType dt) {
  if (pq_.defined() && pq_.size(0) >= n && pq_.size(1) == w && pq_.dtype() == dt) return;
  MemoryScope scope(MemKind::activations);
  for (Tensor* t : {&pq_, &pk_, &pv_, &pdq_, &pdk_, &pdv_}) *t = Tensor(be, {n, w}, dt);
}

void CpAttention::forward_packed(Backend& be, const Tensor& qkv, int64_t T, int64_t H, const Tensor& q_pos,
                                 const Tensor& doc_start, Tensor& out, Tensor& lse) {
  const int64_t n = qkv.size(0), w = qkv.size(1) / 3;
  prepare_packed(be, n, w, qkv.dtype());
  Tensor q = pq_.rows(0, n), k = pk_.rows(0, n), v = pv_.rows(0, n);
  be.copy_columns(qkv, 0, q, 0, w);
  be.copy_columns(qkv, w, k, 0, w);
  be.copy_columns(qkv, 2 * w, v, 0, w);
  forward(be, q, k, v, T, H, H, q_pos, doc_start, out, lse);
}

void CpAttention::backward_packed(Backend& be, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int64_t T, int64_t H, const Tensor& q_pos, const Tensor& doc_start,
                                  Tensor& dqkv) {
  const int64_t n = qkv.size(0), w = qkv.size(1) / 3;
  prepare_packed(be, n, w, qkv.dtype());
  Tensor q = pq_.rows(0, n), k = pk_.rows(0, n), v = pv_.rows(0, n);
  Tensor dq = pdq_.rows(0, n), dk = pdk_.rows(0, n), dv = pdv_.rows(0, n);
  be.copy_columns(qkv, 0, q, 0, w);
  be.copy_columns(qkv, w, k, 0, w);
  be.copy_columns(qkv, 2 * w, v, 0, w);
  backward(be, dout, q, k, v, out, lse, T, H, H, q_pos, doc_start, dq, dk, dv);
  be.copy_columns(dq, 0, dqkv, 0, w);
  be.copy_columns(dk, 0, dqkv, w, w);
  be.copy_columns(dv, 0, dqkv, 2 * w, w);
}

}  // namespace relay
