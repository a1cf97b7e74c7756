// Data parallelism: gradient buckets (PyTorch DDP's design, Li et al., arXiv:2006.15704).
// Every parameter's gradient is a view into a flat bucket. Buckets never mix model chunks; within a
// chunk they are filled in reverse block order up to parallel.bucket_mb, and the schedule's
// allreduce_grads(chunk) action starts the chunk's non-blocking all-reduces once its last weight
// gradient is done, overlapping the rest of the step (other chunks' backward, pipeline cool-down).
#pragma once
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "model/param.hpp"
#include "parallel/trace.hpp"

namespace relay {

struct BucketParam {
  Param* param;
  int chunk;           // the chunk whose allreduce_grads reduces it (the lowest chunk using it)
  int block;           // its first block, for the bucket order
  bool counts_in_norm; // false for the second copy of a weight held by two stages (counted once)
};

class GradBuckets {
 public:
  // comm is null when dp == 1 (then nothing is communicated).
  GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, double bucket_mb);
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
    Tensor flat;  // (numel) every gradient of the bucket
    int chunk = 0;
    bool counts_in_norm = true;
    RequestPtr request;
    bool launched = false;
    int64_t launch_mark = 0;  // when traced
  };
  void launch(Bucket& b);
  Backend& be_;
  Communicator* comm_;
  std::vector<Bucket> buckets_;
  Tracer* tracer_ = nullptr;
  int64_t trace_step_ = 0;
};

}  // namespace relay
