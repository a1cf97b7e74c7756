#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace relay {

GradBuckets::GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, double bucket_mb)
    : be_(be), comm_(comm) {
  // Per (chunk, counts_in_norm), reverse block order; a block's parameters never straddle two buckets.
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto key = [&](size_t i) { return std::make_tuple(params[i].chunk, !params[i].counts_in_norm, -params[i].block); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4));
  std::vector<std::vector<size_t>> groups;
  int64_t fill = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const bool new_group = k == 0 || params[i].chunk != params[order[k - 1]].chunk ||
                           params[i].counts_in_norm != params[order[k - 1]].counts_in_norm;
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
    b.flat = Tensor(be, {total});
    b.chunk = params[g.front()].chunk;
    b.counts_in_norm = params[g.front()].counts_in_norm;
    int64_t at = 0;
    for (size_t i : g) {
      Param* p = params[i].param;
      const int64_t n = p->value.numel();
      p->grad = b.flat.rows(at, n).view(p->value.shape());
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
  }
}

void GradBuckets::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  if (tracer_) b.launch_mark = tracer_->mark();
  if (comm_) b.request = comm_->iallreduce_sum(b.flat);
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
    if (tracer_)
      tracer_->add({cat("allreduce bucket ", k), "allreduce_grads", kTrackComm, trace_step_, -1, b.chunk,
                    b.launch_mark, tracer_->mark(), static_cast<int64_t>(k)});
  }
}

double GradBuckets::sum_squares() {
  double s = 0;
  for (auto& b : buckets_)
    if (b.counts_in_norm) s += be_.sum_squares(b.flat);
  return s;
}

void GradBuckets::scale(float s) {
  for (auto& b : buckets_) be_.scale(b.flat, s);
}

}  // namespace relay
