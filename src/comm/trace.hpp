// Measured timelines ([trace] steps = [first, last]): every rank records the start and end of its
// forward, backward-input, backward-weight and optimizer pieces per micro-batch and chunk, its
// pipeline receive waits, all-reduce waits, data waits, evals and checkpoint writes, as backend
// timing marks (CUDA events on the GPU). At the end (or at a stop on a signal) rank 0 gathers them
// into one Chrome trace-event file (Perfetto, chrome://tracing): a process per rank named with its
// stage and replica, a track per stream (0 compute, 1 communication, 2 input).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"

namespace relay {

enum TraceTrack : int { kTrackCompute = 0, kTrackComm = 1, kTrackInput = 2 };

struct TraceSpan {
  std::string name;  // "F3", "B3.1", "W3", "recv act 3", "allreduce", "optimizer", "data", "eval", "checkpoint"
  std::string op;    // forward | backward | backward_input | backward_weight | optimizer_step | recv_activation |
                     // recv_grad | allreduce_grads | gather_params | reduce_tied_grads | data_wait | eval |
                     // checkpoint
  int track = kTrackCompute;
  int64_t step = 0;
  int micro_batch = -1, chunk = -1;
  int64_t begin = 0, end = 0;  // backend timing marks
  int64_t async_id = -1;       // >= 0: an async span ("b"/"e" events), which may overlap others on its
                               // track: a gradient bucket's all-reduce or a parameter all-gather, from its
                               // launch to its completion
};

class Tracer {
 public:
  // Records steps [first, last]; collective over world (a barrier aligns the ranks' clocks: every
  // rank's time 0 is the same instant to within the barrier's skew).
  Tracer(Backend& be, Communicator& world, int64_t first, int64_t last);
  bool on(int64_t step) const { return step >= first_ && step <= last_; }
  int64_t first() const { return first_; }
  int64_t last() const { return last_; }
  int64_t mark() { return be_.timing_mark(); }
  void add(TraceSpan s) { spans_.push_back(std::move(s)); }
  // Collective: rank 0 writes the file. process_name names this rank; returns, on rank 0, the
  // measured bubble: idle / (ranks x makespan) over the traced steps' spans on the compute tracks.
  double write(const std::string& path, const std::string& process_name);

 private:
  Backend& be_;
  Communicator& world_;
  int64_t first_, last_;
  std::vector<TraceSpan> spans_;
};

// "F3" (forward of micro-batch 3), "B3", "W3"; with chunk >= 0 and virtual stages "F3.1".
std::string compute_span_name(const char* op, int micro_batch, int chunk, bool show_chunk);

}  // namespace relay
