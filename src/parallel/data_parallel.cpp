#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "core/memory.hpp"

namespace relay {

GradBuckets::GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, double bucket_mb,
                         bool zero, GradReduce wire)
    : be_(be), comm_(comm), zero_(zero && comm != nullptr), bf16_wire_(wire == GradReduce::bf16 && comm != nullptr) {
  MemoryScope scope(MemKind::grads);
  // Per (chunk, counts_in_norm), reverse block order; a block's parameters never straddle two buckets.
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto key = [&](size_t i) {
    return std::make_tuple(params[i].chunk, params[i].tied, params[i].tp_replicated, !params[i].counts_in_norm,
                           -params[i].block);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4));
  std::vector<std::vector<size_t>> groups;
  int64_t fill = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const bool new_group = k == 0 || params[i].chunk != params[order[k - 1]].chunk ||
                           params[i].counts_in_norm != params[order[k - 1]].counts_in_norm ||
                           params[i].tp_replicated != params[order[k - 1]].tp_replicated || params[i].tied ||
                           params[order[k - 1]].tied;
    const bool new_block = k == 0 || params[i].block != params[order[k - 1]].block;
    if (new_group || (new_block && fill >= cap)) {
      groups.emplace_back();
      fill = 0;
    }
    groups.back().push_back(i);
    fill += params[i].param->value.numel();
  }
  for (auto& g : groups) {
    int64_t total = 0;
    for (size_t i : g) total += params[i].param->value.numel();
    Bucket b;
    const int64_t dp = zero_ ? comm_->size() : 1, padded = (total + dp - 1) / dp * dp;
    b.flat = Tensor(be, {padded});
    if (zero_) b.shard = Tensor(be, {padded / dp});
    b.chunk = params[g.front()].chunk;
    b.counts_in_norm = params[g.front()].counts_in_norm;
    if (bf16_wire_) {
      b.wire = Tensor(be, {padded}, DType::bf16);
      if (zero_) b.wire_shard = Tensor(be, {padded / dp}, DType::bf16);
    }
    const bool has_work = params[g.front()].param->work.defined();
    if (zero_) {
      MemoryScope as_params(MemKind::params);  // the parameters' new home
      b.values = Tensor(be, {padded});
      be.fill(b.values, 0.f);  // the padding
      if (has_work) b.work = Tensor(be, {padded}, DType::bf16);
    }
    int64_t at = 0;
    for (size_t i : g) {
      Param* p = params[i].param;
      const int64_t n = p->value.numel();
      p->grad = b.flat.rows(at, n).view(p->value.shape());
      if (zero_) {  // the parameter moves into the bucket's flat buffer, initial values and all
        Tensor v = b.values.rows(at, n).view(p->value.shape());
        be.copy(v, p->value);
        p->value = v;
        if (has_work) {
          Tensor w = b.work.rows(at, n).view(p->value.shape());
          be.copy(w, p->work);
          p->work = w;
        }
      }
      b.members.push_back({p, at});
      at += n;
    }
    buckets_.push_back(std::move(b));
  }
}

void GradBuckets::zero() {
  for (auto& b : buckets_) {
    be_.fill(b.flat, 0.f);
    b.request.reset();
    b.launched = false;
    b.widened = false;
  }
}

void GradBuckets::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  if (tracer_) b.launch_mark = tracer_->mark();
  if (!comm_) return;
  if (bf16_wire_) be_.convert(b.flat, b.wire);
  Tensor& send = bf16_wire_ ? b.wire : b.flat;
  if (zero_) b.request = comm_->ireduce_scatter_sum(send, bf16_wire_ ? b.wire_shard : b.shard);
  else b.request = comm_->iallreduce_sum(send);
}

std::vector<OptimSlice> GradBuckets::optimizer_slices() const {
  std::vector<OptimSlice> out;
  for (const Bucket& b : buckets_)
    for (auto& [p, at] : b.members) {
      if (!zero_) {
        out.push_back(whole(p));
        continue;
      }
      const int64_t lo = own_begin(b), hi = lo + b.shard.numel(), n = p->value.numel();
      const int64_t a = std::max(lo, at), e = std::min(hi, at + n);
      if (a >= e) continue;  // another replica's piece
      out.push_back({p, b.values.rows(a, e - a), b.shard.rows(a - lo, e - a), a - at, Tensor()});  // work: gather_params
    }
  return out;
}

Tensor GradBuckets::reduced_grad(Param* p) {
  if (!zero_) return p->grad;
  for (Bucket& b : buckets_)
    if (b.members.size() == 1 && b.members.front().first == p) return b.shard;
  RELAY_ASSERT(false, "tied parameter " << p->name << " has no bucket of its own");
}

void GradBuckets::gather_params() {
  if (!zero_) return;
  std::vector<RequestPtr> reqs;
  for (Bucket& b : buckets_) {
    reqs.push_back(comm_->iallgather(b.values));
    reqs.back()->what = "the ZeRO parameter all-gather";
  }
  for (auto& r : reqs) r->wait();
  for (Bucket& b : buckets_)
    if (b.work.defined()) be_.convert(b.values, b.work);
}

void GradBuckets::launch_chunk(int chunk) {
  for (auto& b : buckets_)
    if (b.chunk == chunk) launch(b);
}

void GradBuckets::progress() {
  for (auto& b : buckets_)
    if (b.request) b.request->test();
}

void GradBuckets::finish() {
  for (auto& b : buckets_) launch(b);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (!b.request) continue;
    b.request->wait();
    if (bf16_wire_ && !b.widened) {  // widen the bf16 sum back into the f32 gradients, once
      b.widened = true;
      if (zero_) be_.convert(b.wire_shard, b.shard);
      else be_.convert(b.wire, b.flat);
    }
    if (tracer_)
      tracer_->add({cat("allreduce bucket ", k), "allreduce_grads", kTrackComm, trace_step_, -1, b.chunk,
                    b.launch_mark, tracer_->mark(), static_cast<int64_t>(k)});
  }
}

double GradBuckets::sum_squares() {
  double s = 0;
  for (auto& b : buckets_)
    if (b.counts_in_norm) s += be_.sum_squares(zero_ ? b.shard : b.flat);
  return s;
}

void GradBuckets::scale(float s) {
  for (auto& b : buckets_) be_.scale(zero_ ? b.shard : b.flat, s);
}

}  // namespace relay
