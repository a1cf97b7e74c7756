#include "train/checkpoint_writer.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/agree.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"
#include "train/memory_plan.hpp"

namespace relay {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointContext& ctx)
    : ctx_(ctx), async_(ctx.cfg.checkpoint.async), rank0_(ctx.grid.world_rank == 0) {
  if (!async_ || !rank0_) return;
  // Allocated and touched now, not at the first checkpoint: a machine short of memory fails at the
  // start, and the first copy does not pay for faulting in 1.4 GiB of fresh pages (GPT-2 124M).
  const int64_t bytes = checkpoint_bytes(ctx_.layout, ctx_.cfg.optimizer);
  host_ = ctx_.be.allocate_host(static_cast<size_t>(bytes));
  std::memset(host_.get(), 0, static_cast<size_t>(bytes));
  std::printf("relay: checkpoint.async: rank 0 keeps a %s MiB host copy of the checkpoint (%s) for the writer "
              "thread\n", mib(bytes).c_str(), ctx_.be.device() == Device::cuda ? "pinned" : "pageable");
  std::fflush(stdout);
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  thread_.join();  // the job is ending on another error; let the file in flight land (or fail) first
  if (!error_.empty()) std::fprintf(stderr, "relay: the checkpoint write in flight failed too: %s\n", error_.c_str());
}

void CheckpointWriter::save(int64_t step) {
  if (!async_) {
    save_checkpoint(ctx_, step);
    return;
  }
  finish();  // one write at a time: the previous file is in place, or its failure ends the job here
  CheckpointImage img = gather_checkpoint(ctx_, step, host_);
  in_flight_ = true;
  if (rank0_) write_in_background(std::move(img));
}

void CheckpointWriter::write_in_background(CheckpointImage img) {
  img.background = true;
  done_ = false;
  tensors_written_ = 0;
  error_.clear();
  thread_ = std::thread([this, img = std::move(img)] {
    try {
      write_checkpoint_image(img, [this] { ++tensors_written_; });
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    last_duration_s_ = now_s() - img.started_s;
    done_ = true;  // publishes error_ and last_duration_s_ to the main thread
  });
}

void CheckpointWriter::wait_for_writer() {
  int64_t seen = tensors_written_.load();
  while (!done_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t n = tensors_written_.load();
    if (n != seen) {  // the writer moved on: this rank is working, not stalled
      seen = n;
      watchdog_progress();
    }
  }
  thread_.join();
}

void CheckpointWriter::poll() { agree_on_outcome(false); }
void CheckpointWriter::finish() { agree_on_outcome(true); }

void CheckpointWriter::agree_on_outcome(bool wait) {
  if (!in_flight_) return;
  if (rank0_ && wait) wait_for_writer();
  // Rank 0's state: 0 still writing, 1 written, 2 failed.
  double state = rank0_ ? (done_.load() ? (error_.empty() ? 1.0 : 2.0) : 0.0) : 0.0;
  ctx_.world.allreduce_host(&state, 1, ReduceOp::max, "the checkpoint writer's outcome");
  if (state == 0) return;
  if (rank0_ && thread_.joinable()) thread_.join();
  in_flight_ = false;
  if (state == 1) return;
  // As agree_on_errors: rank 0 prints its one line, every rank ends with exit code 1.
  if (rank0_) print_error(error_);
  throw AgreedError(rank0_ ? error_ : "rank 0 failed to write a checkpoint");
}

}  // namespace relay
