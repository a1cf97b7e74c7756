// Data parallelism: gradient buckets (PyTorch DDP's design, Li et al., arXiv:2006.15704).
// Every parameter's gradient is a view into a flat bucket. Buckets never mix model chunks; within a
// chunk they are filled in reverse block order up to parallel.bucket_mb, and the schedule's
// allreduce_grads(chunk) action starts the chunk's non-blocking all-reduces once its last weight
// gradient is done, overlapping the rest of the step (other chunks' backward, pipeline cool-down).
//
// ZeRO-1 (Rajbhandari et al., arXiv:1910.02054; optimizer.zero = true): a bucket is padded to a
// multiple of dp and reduce-scattered instead of all-reduced, so replica r holds the summed gradient of
// elements [r n, (r + 1) n) only; the parameters live in one flat buffer per bucket with the same
// layout, the optimizer updates (and keeps state for) that piece alone, and gather_params() all-gathers
// the updated values. Every replica then holds every parameter again, as without ZeRO.
//
// Mixed precision: gradients are f32 buckets whatever the precision; parallel.grad_reduce = "bf16" rounds a
// bucket to bf16 for the all-reduce / reduce-scatter (half the bytes) and widens the sum back. Under ZeRO
// with bf16 working weights, each bucket also holds the working copies, refreshed after the all-gather.
#pragma once
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "model/param.hpp"
#include "optim/optimizer.hpp"
#include "parallel/trace.hpp"

namespace relay {

struct BucketParam {
  Param* param;
  int chunk;           // the chunk whose allreduce_grads reduces it (the lowest chunk using it)
  int block;           // its first block, for the bucket order
  bool counts_in_norm; // false for the second copy of a weight held by two stages (counted once)
  bool tied = false;   // summed with another stage's copy: a bucket of its own (same layout on both)
  bool tp_replicated = false;  // the same on every tp rank (tp > 1): kept apart from split parameters, so
                               // its buckets have one layout on every tp rank and reduce to the same bits
};

class GradBuckets {
 public:
  // comm is null when dp == 1 (then nothing is communicated). zero: ZeRO-1 (needs comm).
  // wire: the dtype gradients travel in (parallel.grad_reduce); they are kept and summed into f32 either way.
  GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, double bucket_mb,
              bool zero = false, GradReduce wire = GradReduce::fp32);
  bool sharded() const { return zero_; }
  // What the optimizer updates: every parameter whole, or (ZeRO) the pieces this replica owns.
  std::vector<OptimSlice> optimizer_slices() const;
  // A tied parameter's reduced gradient that the pair sums: its gradient, or (ZeRO) its owned piece.
  Tensor reduced_grad(Param* p);
  // ZeRO: all-gather the updated parameters (blocking); nothing otherwise.
  void gather_params();
  void zero();                    // start of a step
  void launch_chunk(int chunk);   // allreduce_grads(chunk): start the chunk's all-reduces
  void progress();                // let MPI advance outstanding all-reduces
  void finish();                  // wait for every all-reduce (launching any not yet started)
  double sum_squares();           // of the gradients that count in the norm (after finish)
  void scale(float s);
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // Record each bucket's all-reduce (launch to completion) of this step in tracer (null: do not).
  void set_trace(Tracer* tracer, int64_t step) {
    tracer_ = tracer;
    trace_step_ = step;
  }

 private:
  struct Bucket {
    Tensor flat;  // (padded) every gradient of the bucket (padded to a multiple of dp under ZeRO)
    Tensor values, shard;  // ZeRO: (padded) the parameters; (padded / dp) this replica's summed gradients
    Tensor work;           // ZeRO under bf16: (padded) the parameters' bf16 working copies
    Tensor wire, wire_shard;  // grad_reduce = "bf16": (padded) and (padded / dp) bf16 copies that travel
    std::vector<std::pair<Param*, int64_t>> members;  // each parameter with its offset in flat
    int chunk = 0;
    bool counts_in_norm = true;
    RequestPtr request;
    bool launched = false;
    bool widened = false;  // grad_reduce bf16: the wire's sum is back in the f32 gradients (finish() runs twice
                           // in a step with tied weights; the second must not undo the tied sum)
    int64_t launch_mark = 0;  // when traced
  };
  void launch(Bucket& b);
  int64_t own_begin(const Bucket& b) const { return b.shard.numel() * comm_->rank(); }
  Backend& be_;
  Communicator* comm_;
  bool zero_;
  bool bf16_wire_;
  std::vector<Bucket> buckets_;
  Tracer* tracer_ = nullptr;
  int64_t trace_step_ = 0;
};

}  // namespace relay
