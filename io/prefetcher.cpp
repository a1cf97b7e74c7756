// Prefetcher: one reader thread, two buffers, handed back and forth under a mutex.
#include "io/prefetcher.hpp"

namespace relay {

Prefetcher::Prefetcher(const Hdf5Dataset& data, SamplerSpec sampler, int64_t first_step, int64_t begin,
                       int64_t count, bool want_inputs, bool want_targets, bool preloaded)
    : Prefetcher(&data, nullptr, sampler, first_step, begin, count, want_inputs, want_targets, preloaded) {}

Prefetcher::Prefetcher(const TokenDataset& data, SamplerSpec sampler, int64_t first_step, int64_t begin,
                       int64_t count, bool want_inputs, bool want_targets)
    : Prefetcher(nullptr, &data, sampler, first_step, begin, count, want_inputs, want_targets, false) {}

Prefetcher::Prefetcher(const Hdf5Dataset* data, const TokenDataset* tokens, SamplerSpec sampler, int64_t first_step,
                       int64_t begin, int64_t count, bool want_inputs, bool want_targets, bool preloaded)
    : data_(data),
      tokens_(tokens),
      sampler_(sampler),
      first_step_(first_step),
      begin_(begin),
      count_(count),
      want_inputs_(want_inputs),
      want_targets_(want_targets),
      preloaded_(preloaded),
      next_step_(first_step) {
  if (first_step < 0 || begin < 0 || count < 0 || begin + count > sampler.batch_size)
    throw Error(cat("prefetcher: first step ", first_step, " and slice [", begin, ", ", begin + count,
                    ") must be non-negative and lie within the global batch [0, ", sampler.batch_size, ")"));
  thread_ = std::thread(&Prefetcher::run, this);
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();  // a read in progress finishes first
}

const HostBatch& Prefetcher::next() {
  std::unique_lock lock(mutex_);
  if (holding_) {  // the caller is done with the previous batch: the thread may refill it
    slot_of(next_step_ - 1).ready = false;
    holding_ = false;
    changed_.notify_all();
  }
  Slot& slot = slot_of(next_step_);
  changed_.wait(lock, [&] { return slot.ready; });
  if (slot.error) std::rethrow_exception(slot.error);
  holding_ = true;
  ++next_step_;
  return slot.batch;
}

void Prefetcher::run() {
  for (int64_t step = first_step_;; ++step) {
    Slot& slot = slot_of(step);
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || !slot.ready; });
      if (stop_) return;
    }
    // The slot is not ready, so the caller does not touch it: fill it without the lock.
    std::exception_ptr error;
    try {
      fill(slot.batch, step);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      slot.error = error;
      slot.ready = true;
    }
    changed_.notify_all();
    if (error) return;  // next() rethrows it when the caller reaches this step
  }
}

void Prefetcher::fill(HostBatch& batch, int64_t step) {
  sampler_.batch(step, begin_, count_, rows_);
  batch.step = step;
  if (tokens_) {
    const size_t n = static_cast<size_t>(count_ * tokens_->block_size());
    if (want_inputs_) batch.tokens.resize(n);
    if (want_targets_) batch.class_targets.resize(n);
    tokens_->read(rows_, want_inputs_ ? batch.tokens.data() : nullptr,
                  want_targets_ ? batch.class_targets.data() : nullptr);
    return;
  }
  if (want_inputs_ && preloaded_) {
    batch.rows.assign(rows_.begin(), rows_.end());  // int32: the preloaded inputs' rows (checked at preload)
  } else if (want_inputs_) {
    batch.inputs.resize(static_cast<size_t>(count_ * data_->features()));
    data_->read_inputs(rows_, batch.inputs.data());
  }
  if (want_targets_ && data_->target_kind() == TargetKind::class_index) {
    batch.class_targets.resize(static_cast<size_t>(count_));
    data_->read_targets(rows_, batch.class_targets.data());
  } else if (want_targets_) {
    batch.dense_targets.resize(static_cast<size_t>(count_ * data_->target_dim()));
    data_->read_targets(rows_, batch.dense_targets.data());
  }
}

}  // namespace relay
