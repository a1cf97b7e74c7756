// When and how a training run writes its checkpoints: synchronously (every rank waits while rank 0
// writes, as before) or, with checkpoint.async = true, in a writer thread on rank 0.
//
// Asynchronous checkpoints: at a checkpoint step every rank copies what it contributes into host
// memory and sends it to rank 0 (gather_checkpoint, at the step boundary, so the tensors are those of
// that step), which assembles the whole checkpoint in one host block (pinned on CUDA, allocated at the
// start and kept: checkpoint_bytes, predicted by `relay plan`); training then continues while the writer
// thread writes the file with the synchronous path's guarantees (temporary file, fsync, rename,
// `latest`, pruning). Only that thread touches the block until the write ends. HDF5: every HDF5 call in
// Relay holds Hdf5Lock (io/hdf5_util.hpp); the writer releases it between tensors, so the prefetcher's
// and evaluation's dataset reads interleave with the write instead of waiting for the whole file.
//
// The outcome reaches every rank at the next step boundary (poll, one small reduction per step while
// a write is in flight): a failed write (disk full, permission) ends every rank there with rank 0's
// one line and exit code 1, as a synchronous failure does. The next checkpoint, a stop (signal or
// train.time_limit) and the end of training wait for the write in flight (finish). While rank 0 waits,
// its main thread reports progress to the watchdog after each tensor the writer completes, so a slow
// filesystem is not a stalled rank, and a wedged one is named as before.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "train/checkpointing.hpp"

namespace relay {

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointContext& ctx);
  ~CheckpointWriter();  // waits for a write in flight (an error path: its outcome is only logged)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective: the checkpoint of `step`. Synchronous: written when it returns. Asynchronous: waits
  // for the previous write, copies, and returns once rank 0's writer thread has started.
  void save(int64_t step);
  // Collective, every step boundary: ends every rank with the writer's message if a write failed.
  void poll();
  // Collective: waits for the write in flight, then as poll().
  void finish();
  // Rank 0: seconds of the last checkpoint from its start to its file in place (time-limit planning).
  double last_duration_s() const { return last_duration_s_.load(); }
  // Every rank: a write was started and its outcome is not yet agreed (a stop would wait for it).
  bool in_flight() const { return in_flight_; }

 private:
  void write_in_background(CheckpointImage img);
  void wait_for_writer();  // rank 0: until the thread ends, reporting its progress to the watchdog
  void agree_on_outcome(bool wait);

  CheckpointContext& ctx_;
  const bool async_, rank0_;
  bool in_flight_ = false;  // every rank: a write was started and its outcome not yet agreed
  std::shared_ptr<std::byte> host_;  // rank 0, async: the checkpoint's host copy (checkpoint_bytes)
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<int64_t> tensors_written_{0};
  std::string error_;  // the writer's failure, read once done_
  std::atomic<double> last_duration_s_{0};
};

}  // namespace relay
