// Data parallelism: gradient buckets (PyTorch DDP's design, Li et al., arXiv:2006.15704).
// Every parameter's gradient is a view into a flat bucket; buckets are filled in reverse layer order
// (the order backward finishes them) up to parallel.bucket_mb, and each bucket's non-blocking
// all-reduce starts as soon as its last layer's gradients are final, overlapping the rest of backward.
#pragma once
#include <set>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "model/layer.hpp"

namespace relay {

class GradBuckets {
 public:
  // comm is null when dp == 1 (then nothing is communicated). layer_of[i] is params[i]'s config layer.
  GradBuckets(Backend& be, Communicator* comm, const std::vector<Param*>& params, const std::vector<int>& layer_of,
              double bucket_mb);
  void zero();                    // start of a step
  void layer_ready(int layer);    // this layer's gradients are final for the step
  void progress();                // let MPI advance outstanding all-reduces
  void finish();                  // launch what is left and wait for every all-reduce
  double sum_squares();           // of all gradients held here (after finish)
  void scale(float s);
  int bucket_count() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    Tensor flat;            // (numel) every gradient of the bucket
    std::set<int> layers;   // config layers whose gradients live here
    std::set<int> ready;
    RequestPtr request;
    bool launched = false;
  };
  void launch(Bucket& b);
  Backend& be_;
  Communicator* comm_;
  std::vector<Bucket> buckets_;
};

}  // namespace relay
