// Prefetcher: a background thread that reads the next batch from HDF5 while the current one computes.
// Two HostBatch buffers alternate (double buffering): the trainer holds one, the thread fills the
// other, so once both are sized nothing is allocated per step.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "io/dataset.hpp"
#include "io/token_dataset.hpp"
#include "io/sampler.hpp"

namespace relay {

struct HostBatch {
  int64_t step = -1;
  std::vector<float> inputs;           // (count, D); empty unless inputs were requested
  std::vector<int32_t> tokens;         // (count, T) token ids of a language model's sequences
  std::vector<int32_t> class_targets;  // (count) class indices, or (count, T) next tokens; when requested
  std::vector<float> dense_targets;    // (count, K); dense targets, when targets were requested
  std::vector<int32_t> rows;           // (count) the samples' rows in the file, when the inputs are preloaded
};

class Prefetcher {
 public:
  // Reads, for steps first_step, first_step+1, ..., rows [begin, begin+count) of each global batch
  // (this replica's slice); inputs only if want_inputs, targets only if want_targets (the first
  // pipeline stage needs inputs, the last needs targets). `data` must outlive the Prefetcher.
  // preloaded: the inputs are held on the device (data.preload): `rows` names the samples instead of reading them.
  Prefetcher(const Hdf5Dataset& data, SamplerSpec sampler, int64_t first_step, int64_t begin, int64_t count,
             bool want_inputs, bool want_targets, bool preloaded = false);
  // The same over a token file: sequences are the samples; inputs fill `tokens`, targets `class_targets`.
  Prefetcher(const TokenDataset& data, SamplerSpec sampler, int64_t first_step, int64_t begin, int64_t count,
             bool want_inputs, bool want_targets);
  ~Prefetcher();  // stops and joins the thread
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next step's batch; blocks until it is read. Valid until the next call, which hands its buffer
  // back to the thread. An exception thrown while reading is rethrown here, on this and every later call.
  const HostBatch& next();

 private:
  struct Slot {
    HostBatch batch;
    bool ready = false;  // filled and not yet handed back; guarded by mutex_
    std::exception_ptr error;
  };
  Prefetcher(const Hdf5Dataset* data, const TokenDataset* tokens, SamplerSpec sampler, int64_t first_step,
             int64_t begin, int64_t count, bool want_inputs, bool want_targets, bool preloaded);
  void run();  // the thread: fills slot (step - first_step) % 2 whenever it is free
  void fill(HostBatch& batch, int64_t step);
  Slot& slot_of(int64_t step) { return slots_[static_cast<size_t>((step - first_step_) % 2)]; }

  const Hdf5Dataset* data_;            // one of these two
  const TokenDataset* tokens_;
  Sampler sampler_;            // used by the thread only
  std::vector<int64_t> rows_;  // (count) sample indices of the step being read; thread only
  const int64_t first_step_, begin_, count_;
  const bool want_inputs_, want_targets_, preloaded_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::array<Slot, 2> slots_;
  int64_t next_step_;     // the step next() returns next
  bool holding_ = false;  // the caller holds the slot of next_step_ - 1
  bool stop_ = false;
  std::thread thread_;  // started last, once everything above exists
};

}  // namespace relay
