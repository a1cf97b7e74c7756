#include "model/context_parallel.hpp"

#include <algorithm>
#include <chrono>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/test_faults.hpp"
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
    if (overlap_) {  // cap = cp x the local rows
      const int64_t local = cap / cp;
      rank_order_v_ = Tensor(be, {cap, wv}, dt);
      rank_of_remote_ = Tensor(be, {cap - local}, DType::i32);
      remote_of_rank_ = Tensor(be, {cap - local}, DType::i32);
      dkl_ = Tensor(be, {local, w}, dt);
      dvl_ = Tensor(be, {local, wv}, dt);
      for (Tensor* t : {&remote_pos_, &local_doc_, &remote_doc_}) *t = Tensor(be, {local}, DType::i32);
    }
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
  T_ = T;  // own_before reads it
  if (overlap_) {  // the other ranks' rows in remote order (sequence order, this rank's rows left out)
    const int64_t rest = rows - n, Tr = T - Tl;
    std::vector<int32_t> of_remote(static_cast<size_t>(rest)), of_rank(static_cast<size_t>(rest)),
        pos(static_cast<size_t>(n));
    for (int64_t r = 0, i = 0; r < cp; ++r) {
      if (r == rank_) continue;
      for (int64_t s = 0; s < B; ++s)
        for (int64_t j = 0; j < Tl; ++j, ++i) {
          const int64_t p = cp_position(T, int(cp), int(r), j), remote_row = s * Tr + p - own_before(p);
          of_remote[static_cast<size_t>(remote_row)] = int32_t(r * n + s * Tl + j);
          of_rank[static_cast<size_t>(i)] = int32_t(remote_row);
        }
    }
    // Local query j at position p sees the remote rows before p + 1: the last is at remote position
    // p + 1 - own_before(p + 1) - 1 (-1: it sees none, rank 0's first chunk).
    for (int64_t s = 0; s < B; ++s)
      for (int64_t j = 0; j < Tl; ++j) {
        const int64_t p = cp_position(T, int(cp), rank_, j);
        pos[static_cast<size_t>(s * Tl + j)] = int32_t(p - own_before(p + 1));
      }
    Tensor a = rank_of_remote_.rows(0, rest), b = remote_of_rank_.rows(0, rest), c = remote_pos_.rows(0, n);
    be.upload(a, of_remote.data());
    be.upload(b, of_rank.data());
    be.upload(c, pos.data());
  }
  n_ = n;
  T_ = T;
}

void CpAttention::wait(const RequestPtr& r) {
  const auto t0 = std::chrono::steady_clock::now();
  r->wait();
  waited_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t CpAttention::own_before(int64_t x) const {
  const int64_t c = T_ / (2 * size_);
  return std::clamp<int64_t>(x - rank_ * c, 0, c) + std::clamp<int64_t>(x - (2 * size_ - 1 - rank_) * c, 0, c);
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
  wait(r);
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
  wait(r);
  if (tracer_) trace(name, "cp_reduce_scatter", m0);
}

void CpAttention::forward(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int64_t T, int64_t H,
                          int64_t KV, const Tensor& q_pos, const Tensor& doc_start, Tensor& out, Tensor& lse) {
  if (overlap_) return forward_overlapped(be, q, k, v, T, H, KV, doc_start, out, lse);
  const int64_t n = q.size(0), rows = size_ * n, Tl = T / size_;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  Tensor kf = k_.rows(0, rows), vf = v_.rows(0, rows);  // (B*T, KV*hd), (B*T, KV*hd_v) sequence order
  gather(be, k, kf, "the context-parallel key all-gather", "cp all-gather k");
  gather(be, v, vf, "the context-parallel value all-gather", "cp all-gather v");
  be.flash_attention_gqa_forward_at(q, kf, vf, n / Tl, Tl, T, q_pos, H, KV, out, lse, doc_start);
}

void CpAttention::backward(Backend& be, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& lse, int64_t T, int64_t H, int64_t KV, const Tensor& q_pos,
                           const Tensor& doc_start, Tensor& dq, Tensor& dk, Tensor& dv,
                           const std::function<void()>& meanwhile) {
  if (overlap_) return backward_overlapped(be, dout, q, k, v, out, lse, T, H, KV, doc_start, dq, dk, dv, meanwhile);
  const int64_t n = q.size(0), rows = size_ * n, Tl = T / size_;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  Tensor kf = k_.rows(0, rows), vf = v_.rows(0, rows), dkf = dk_.rows(0, rows), dvf = dv_.rows(0, rows);
  gather(be, k, kf, "the context-parallel key all-gather (backward)", "cp all-gather k (backward)");
  gather(be, v, vf, "the context-parallel value all-gather (backward)", "cp all-gather v (backward)");
  be.flash_attention_gqa_backward_at(dout, q, kf, vf, out, lse, n / Tl, Tl, T, q_pos, H, KV, dq, dkf, dvf, doc_start);
  reduce_scatter(be, dkf, dk, "the context-parallel key-gradient reduce-scatter", "cp reduce-scatter dk");
  reduce_scatter(be, dvf, dv, "the context-parallel value-gradient reduce-scatter", "cp reduce-scatter dv");
  if (meanwhile) meanwhile();
}

namespace {
// A scratch tensor of `shape` and dtype dt viewed from t, which is (re)allocated when too small or of another dtype.
Tensor scratch(Backend& be, Tensor& t, std::vector<int64_t> shape, DType dt) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (!t.defined() || t.numel() < numel || t.dtype() != dt) {
    MemoryScope scope(MemKind::activations);
    t = Tensor(be, {numel}, dt);
  }
  return t.view({t.numel()}).rows(0, numel).view(std::move(shape));
}
}  // namespace

RequestPtr CpAttention::start_gather(Backend& be, const Tensor& local, Tensor& buf, const char* what) {
  const int64_t n = local.size(0);
  Tensor mine = buf.rows(rank_ * n, n);
  be.copy(mine, local);
  RequestPtr r = comm_->iallgather(buf);
  r->what = what;
  test_fault_point("cp");  // test only: a rank stopped or lost while it travels
  return r;
}

void CpAttention::part_masks(Backend& be, const Tensor& doc_start, Tensor& local_doc, Tensor& remote_doc) {
  if (!doc_start.defined()) return;
  const int64_t n = doc_start.numel();
  std::vector<int32_t> d(static_cast<size_t>(n)), ld(d.size()), rd(d.size());
  be.download(d.data(), doc_start);
  // A query's document starts at sequence position d: its first visible own row is the own_before(d)-th of them
  // and its first visible remote row the (d - own_before(d))-th (both non-decreasing in d, as the kernels need;
  // past the query's last visible row where it sees none of that part).
  for (size_t i = 0; i < d.size(); ++i) {
    const int64_t own = own_before(d[i]);
    ld[i] = int32_t(own);
    rd[i] = int32_t(d[i] - own);
  }
  local_doc = local_doc_.rows(0, n);
  remote_doc = remote_doc_.rows(0, n);
  be.upload(local_doc, ld.data());
  be.upload(remote_doc, rd.data());
}

// This rank's rows of a sequence, chunks i and 2cp - 1 - i in that order, are a causal sequence of their own: local
// query j sees local keys [0, j] (all of chunk i lies before chunk 2cp - 1 - i). So the first part is plain causal
// flash attention over the local rows, 1/cp of the keys. The other ranks' rows follow in remote order.
void CpAttention::forward_overlapped(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int64_t T,
                                     int64_t H, int64_t KV, const Tensor& doc_start, Tensor& out, Tensor& lse) {
  const int64_t n = q.size(0), rows = size_ * n, rest = rows - n, Tl = T / size_, B = n / Tl;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  const int64_t m0 = tracer_ ? tracer_->mark() : 0;
  Tensor kbuf = rank_order(rows, k.size(1));                 // (cp n, KV*hd) rank order
  Tensor vbuf = rank_order_v_.rows(0, rows);                 // (cp n, KV*hd_v) rank order
  RequestPtr rk = start_gather(be, k, kbuf, "the context-parallel key all-gather");
  RequestPtr rv = start_gather(be, v, vbuf, "the context-parallel value all-gather");
  Tensor local_doc, remote_doc;
  part_masks(be, doc_start, local_doc, remote_doc);
  // While they travel: the queries against this rank's own rows.
  be.flash_attention_gqa_forward(q, k, v, B, Tl, H, KV, out, lse, local_doc);
  wait(rk);
  wait(rv);
  if (tracer_) {  // each span from its start to its wait: the time in flight, the own rows' attention included
    trace("cp all-gather k", "cp_allgather", m0);
    trace("cp all-gather v", "cp_allgather", m0);
  }
  Tensor kr = k_.rows(0, rest), vr = v_.rows(0, rest);  // (B (T - Tl), KV*hd), (B (T - Tl), KV*hd_v) remote order
  be.gather_rows(kbuf, rank_of_remote_.rows(0, rest), kr);
  be.gather_rows(vbuf, rank_of_remote_.rows(0, rest), vr);
  Tensor out2 = scratch(be, out2_, {n, out.numel() / n}, out.dtype());  // (n, H*hd_v)
  Tensor lse2 = scratch(be, lse2_, {B, H, Tl}, DType::f32);             // (B, H, Tl)
  be.flash_attention_gqa_forward_at(q, kr, vr, B, Tl, T - Tl, remote_pos_.rows(0, n), H, KV, out2, lse2,
                                    remote_doc);
  be.attention_merge(out, lse, out2, lse2, B, Tl, H);
}

// The flash backward with the final out and lse is a sum over key blocks: the own rows' part (dq's first term, the
// own keys' gradients from this rank's queries) while the gathers travel, then the remote part; the two key-gradient
// reduce-scatters then run together (still waited for before returning: the next block's backward needs dq).
void CpAttention::backward_overlapped(Backend& be, const Tensor& dout, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& out, const Tensor& lse, int64_t T, int64_t H,
                                      int64_t KV, const Tensor& doc_start, Tensor& dq, Tensor& dk, Tensor& dv,
                                      const std::function<void()>& meanwhile) {
  const int64_t n = q.size(0), rows = size_ * n, rest = rows - n, Tl = T / size_, B = n / Tl;
  prepare(be, n, T, k.size(1), v.size(1), k.dtype());
  Tensor kbuf = rank_order(rows, k.size(1)), vbuf = rank_order_v_.rows(0, rows);  // (cp n, KV*hd), (cp n, KV*hd_v)
  RequestPtr rk, rv;
  int64_t m0 = 0;
  if (early_k_) {  // prefetch_backward_packed started them
    rk = std::move(early_k_);
    rv = std::move(early_v_);
    m0 = early_mark_;
  } else {
    m0 = tracer_ ? tracer_->mark() : 0;
    rk = start_gather(be, k, kbuf, "the context-parallel key all-gather (backward)");
    rv = start_gather(be, v, vbuf, "the context-parallel value all-gather (backward)");
  }
  Tensor local_doc, remote_doc;
  part_masks(be, doc_start, local_doc, remote_doc);
  Tensor dkl = dkl_.rows(0, n), dvl = dvl_.rows(0, n);  // (n, KV*hd), (n, KV*hd_v) own keys, own queries
  be.flash_attention_gqa_backward(dout, q, k, v, out, lse, B, Tl, H, KV, dq, dkl, dvl, local_doc);
  wait(rk);
  wait(rv);
  if (tracer_) {
    trace("cp all-gather k (backward)", "cp_allgather", m0);
    trace("cp all-gather v (backward)", "cp_allgather", m0);
  }
  Tensor kr = k_.rows(0, rest), vr = v_.rows(0, rest), dkr = dk_.rows(0, rest), dvr = dv_.rows(0, rest);
  be.gather_rows(kbuf, rank_of_remote_.rows(0, rest), kr);
  be.gather_rows(vbuf, rank_of_remote_.rows(0, rest), vr);
  Tensor dq2 = scratch(be, dq2_, {n, q.size(1)}, q.dtype());  // (n, H*hd)
  be.flash_attention_gqa_backward_at(dout, q, kr, vr, out, lse, B, Tl, T - Tl, remote_pos_.rows(0, n), H, KV, dq2,
                                     dkr, dvr, remote_doc);
  be.add(dq, dq2, dq);
  // Every rank's key gradients from this rank's queries, rank order: own rows from the first part, the others'
  // from the remote part.
  const int64_t m1 = tracer_ ? tracer_->mark() : 0;
  const int64_t before = rank_ * n, after = rest - before;
  auto to_rank_order = [&](const Tensor& own, const Tensor& remote, Tensor& buf) {
    Tensor mine = buf.rows(rank_ * n, n);
    be.copy(mine, own);
    if (before > 0) {
      Tensor lo = buf.rows(0, before);
      be.gather_rows(remote, remote_of_rank_.rows(0, before), lo);
    }
    if (after > 0) {
      Tensor hi = buf.rows(rank_ * n + n, after);
      be.gather_rows(remote, remote_of_rank_.rows(before, after), hi);
    }
  };
  to_rank_order(dkl, dkr, kbuf);
  to_rank_order(dvl, dvr, vbuf);
  RequestPtr sk = comm_->ireduce_scatter_sum(kbuf, dk);
  sk->what = "the context-parallel key-gradient reduce-scatter";
  RequestPtr sv = comm_->ireduce_scatter_sum(vbuf, dv);
  sv->what = "the context-parallel value-gradient reduce-scatter";
  if (meanwhile) meanwhile();
  wait(sk);
  wait(sv);
  if (tracer_) {
    trace("cp reduce-scatter dk", "cp_reduce_scatter", m1);
    trace("cp reduce-scatter dv", "cp_reduce_scatter", m1);
  }
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

void CpAttention::prefetch_backward_packed(Backend& be, const Tensor& qkv, int64_t T) {
  if (!overlap_ || early_k_) return;
  const int64_t n = qkv.size(0), w = qkv.size(1) / 3, rows = size_ * n;
  prepare_packed(be, n, w, qkv.dtype());
  Tensor k = pk_.rows(0, n), v = pv_.rows(0, n);  // (n, Cl) each
  be.copy_columns(qkv, w, k, 0, w);
  be.copy_columns(qkv, 2 * w, v, 0, w);
  prepare(be, n, T, w, w, qkv.dtype());
  early_mark_ = tracer_ ? tracer_->mark() : 0;
  Tensor kbuf = rank_order(rows, w), vbuf = rank_order_v_.rows(0, rows);  // (cp n, Cl) each, rank order
  early_k_ = start_gather(be, k, kbuf, "the context-parallel key all-gather (backward)");
  early_v_ = start_gather(be, v, vbuf, "the context-parallel value all-gather (backward)");
}

void CpAttention::backward_packed(Backend& be, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int64_t T, int64_t H, const Tensor& q_pos, const Tensor& doc_start,
                                  Tensor& dqkv, const std::function<void()>& meanwhile) {
  const int64_t n = qkv.size(0), w = qkv.size(1) / 3;
  prepare_packed(be, n, w, qkv.dtype());
  Tensor q = pq_.rows(0, n), k = pk_.rows(0, n), v = pv_.rows(0, n);
  Tensor dq = pdq_.rows(0, n), dk = pdk_.rows(0, n), dv = pdv_.rows(0, n);
  be.copy_columns(qkv, 0, q, 0, w);
  if (!early_k_) {  // else prefetch_backward_packed copied k and v, and its gathers in flight read them
    be.copy_columns(qkv, w, k, 0, w);
    be.copy_columns(qkv, 2 * w, v, 0, w);
  }
  backward(be, dout, q, k, v, out, lse, T, H, H, q_pos, doc_start, dq, dk, dv, meanwhile);
  be.copy_columns(dq, 0, dqkv, 0, w);
  be.copy_columns(dk, 0, dqkv, w, w);
  be.copy_columns(dv, 0, dqkv, 2 * w, w);
}

}  // namespace relay
