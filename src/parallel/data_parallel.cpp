#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <numeric>

namespace relay {

GradBuckets::GradBuckets(Backend& be, Communicator* comm, const std::vector<Param*>& params,
                         const std::vector<int>& layer_of, double bucket_mb)
    : be_(be), comm_(comm) {
  // Reverse layer order; a layer's parameters never straddle two buckets.
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return layer_of[a] > layer_of[b]; });
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4));
  std::vector<std::vector<size_t>> groups;
  int64_t fill = 0;
  int last_layer = -1;
  for (size_t i : order) {
    bool new_layer = layer_of[i] != last_layer;
    if (groups.empty() || (new_layer && fill >= cap)) {
      groups.emplace_back();
      fill = 0;
    }
    groups.back().push_back(i);
    fill += params[i]->value.numel();
    last_layer = layer_of[i];
  }
  for (auto& g : groups) {
    int64_t total = 0;
    for (size_t i : g) total += params[i]->value.numel();
    Bucket b;
    b.flat = Tensor(be, {total});
    int64_t at = 0;
    for (size_t i : g) {
      int64_t n = params[i]->value.numel();
      params[i]->grad = b.flat.rows(at, n).view(params[i]->value.shape());
      at += n;
      b.layers.insert(layer_of[i]);
    }
    buckets_.push_back(std::move(b));
  }
}

void GradBuckets::zero() {
  for (auto& b : buckets_) {
    be_.fill(b.flat, 0.f);
    b.ready.clear();
    b.request.reset();
    b.launched = false;
  }
}

void GradBuckets::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  if (comm_) b.request = comm_->iallreduce_sum(b.flat);
}

void GradBuckets::layer_ready(int layer) {
  for (auto& b : buckets_)
    if (b.layers.count(layer)) {
      b.ready.insert(layer);
      if (b.ready.size() == b.layers.size()) launch(b);
    }
}

void GradBuckets::progress() {
  for (auto& b : buckets_)
    if (b.request) b.request->test();
}

void GradBuckets::finish() {
  for (auto& b : buckets_) launch(b);
  for (auto& b : buckets_)
    if (b.request) b.request->wait();
}

double GradBuckets::sum_squares() {
  double s = 0;
  for (auto& b : buckets_) s += be_.sum_squares(b.flat);
  return s;
}

void GradBuckets::scale(float s) {
  for (auto& b : buckets_) be_.scale(b.flat, s);
}

}  // namespace relay
