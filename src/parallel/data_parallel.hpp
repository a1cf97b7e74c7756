// Data parallelism: gradient buckets (PyTorch DDP's design, Li et al., arXiv:2006.15704).
// What each ZeRO stage shards and moves for the dense and the expert weights, and when, is parallel/sharding.hpp's
// description (describe_sharding); GradBuckets follows it, and the notes below say how.
// Every parameter's gradient is a view into a flat bucket. Buckets never mix model chunks; within a
// chunk they are filled in reverse block order up to parallel.bucket_mb, and the schedule's
// allreduce_grads(chunk) action starts the chunk's non-blocking all-reduces once its last weight
// gradient is done, overlapping the rest of the step (other chunks' backward, pipeline cool-down). With
// parallel.overlap (launch_when_filled) each bucket starts instead as soon as the last micro-batch's backward has
// written it (DDP's rule), moved by the progress thread (comm/progress.hpp) while the blocks below run their backward,
// and ZeRO-1/2's parameter all-gather is waited for where the next forward first reads the bucket.
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
//
// ZeRO-3 (optimizer.zero = 3; FSDP's design, Zhao et al., arXiv:2304.11277): the parameters are sharded too. Every
// block is a bucket of its own (a unit), whose fp32 masters this rank holds 1/dp of (the optimizer updates them); a
// block about to run gathers its units in the working dtype (one all-gather each, the next block's issued ahead) and
// frees them when done (parallel.reshard_after_forward; kept to the end of the step otherwise); gradients as ZeRO-2.
// Under pp > 1 a stage's parameters are gathered once and kept for the step, and its gradients are whole buckets
// during the step, reduce-scattered once after the last micro-batch and freed. Outside a block's run (or the step)
// a parameter's value and working copy are undefined.
//
// ZeRO-2 (optimizer.zero = 2): a rank keeps only its shard of each bucket's summed gradient. A bucket's gradients
// live in a pooled buffer from the moment the backward first writes one of them in a micro-batch (the chunk's
// BlockHooks) until its last writer block is done, when the buffer is reduce-scattered (that micro-batch's
// contribution) and, once reclaimed, added into the shard; the buffer then serves another bucket (Zero2Pool: one
// in flight beside the open ones). Gradient memory is the shard plus a few buckets, whatever the model's
// size. Micro-batches are summed in the shard in their order (deterministic); with one micro-batch the sum is
// ZeRO-1's, bit for bit.
//
// Expert parallelism (parallel.ep): an expert's weights are summed over the ranks holding the same experts only
// (expert_comm, dp / ep of them), so every ZeRO stage shards an expert bucket over that group: its padding, shard,
// reduce-scatter, all-gather and master piece follow the bucket's communicator, not the replicas'. Where the experts
// have no other copy (ep == dp) their buckets have no communicator: kept whole at every stage, as without ZeRO
// (nothing to reduce or gather; the rank owns them).
#pragma once
#include <functional>
#include <utility>
#include <map>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "model/chunk.hpp"
#include "model/param.hpp"
#include "optim/optimizer.hpp"
#include "comm/trace.hpp"
#include "parallel/sharding.hpp"

namespace relay {

struct BucketParam {
  Param* param;
  int chunk;           // the chunk whose allreduce_grads reduces it (the lowest chunk using it)
  int block;           // its first block, for the bucket order
  bool counts_in_norm; // false for the second copy of a weight held by two stages (counted once)
  bool tied = false;   // summed with another stage's copy: a bucket of its own (same layout on both)
  bool tp_replicated = false;  // the same on every tp rank (tp > 1): kept apart from split parameters, so
                               // its buckets have one layout on every tp rank and reduce to the same bits
  bool expert = false;  // an expert's weight under parallel.ep: summed over the ranks holding the same experts only
};

// Bucket size limits (MiB of f32): `mb` (parallel.bucket_mb; 0: a bucket per block), and `first_mb` for the first
// bucket of each run of buckets the backward fills in turn (parallel.first_bucket_mb; negative: as mb). PyTorch DDP's
// rule: a small first bucket starts the communication early, while the rest of the backward runs. A block's
// parameters never straddle two buckets, so a bucket is at least one block.
struct BucketCaps {
  BucketCaps(double mb_ = 25.0, double first_mb_ = -1.0) : mb(mb_), first_mb(first_mb_) {}
  double mb, first_mb;
};

// The bucket layout, a pure function of the parameters (relay plan computes it before anything exists).
struct BucketKey {
  int64_t numel = 0;
  int chunk = 0, block = 0;  // as BucketParam
  bool counts_in_norm = true, tied = false, tp_replicated = false, expert = false;
  bool fp8 = false;  // ZeRO-3 under train.precision = "fp8": an FP8 linear weight (Param::fp8_weight), in units apart
};
struct BucketLayout {
  std::vector<std::vector<size_t>> groups;  // each bucket's parameters (indices into the keys), in bucket order
  std::vector<int64_t> padded;              // each bucket's elements, padded to a multiple of its shards
  std::vector<int> shards;                  // each bucket's ranks that shard it: `dp`, or expert_dp for an expert's
};
// Expert weights (parallel.ep) get buckets of their own, padded to a multiple of expert_dp (0: dp).
BucketLayout layout_buckets(const std::vector<BucketKey>& keys, BucketCaps caps, int dp, int expert_dp = 0);
// ZeRO-2: what each parameter block (BlockSpec::index) does to the buckets it writes, from the chunks' parameter
// blocks (each chunk's in block order) and the buckets each block writes. A bucket is open over a run of writers that
// follow each other in the backward and is launched after the run's last (lowest) block; a bucket written by blocks
// far apart (the tied embedding: the head, then the embedding) is launched once per run, each run's sum a part of
// the total (the shard adds them).
struct Zero2Write {
  int bucket = 0;
  bool closes = false;  // this block ends a run of the bucket's writers: launch it after the block
};
std::map<int, std::vector<Zero2Write>> zero2_writes(const std::vector<std::vector<int>>& chunk_param_blocks,
                                                    const std::map<int, std::vector<int>>& buckets_of_block);

// ZeRO-2's buffer pool as pure bookkeeping (GradBuckets follows it with real buffers; relay plan replays the
// schedule through it, so both make the same buffers): a buffer holds a bucket's gradients and the piece of their sum
// this rank receives (its shard: smaller for a dense bucket than for an expert's of the same size under ep). An
// opening bucket takes the smallest free buffer that fits (both), at most twice its size, or a new one of its exact
// sizes; a launched bucket's buffer stays in flight until reclaimed, oldest first, as soon as more than kInFlight
// are, or when the only buffers that fit an opening bucket are in flight (rather than allocate another: the
// embedding's bucket, opened again by the next micro-batch while the last is in flight). `reclaim` finishes a
// buffer's reduce-scatter before the pool frees it.
class Zero2Pool {
 public:
  static constexpr size_t kInFlight = 1;  // one bucket's reduce-scatter hides behind the next block's backward
  using Reclaim = std::function<void(int buffer)>;
  int open(int64_t elems, int64_t piece, const Reclaim& reclaim);  // a buffer for a bucket of `elems` (shard: piece)
  void close(int buffer, const Reclaim& reclaim);    // its bucket launched: in flight
  void drain(const Reclaim& reclaim);                // every buffer in flight, oldest first
  const std::vector<int64_t>& capacities() const { return cap_; }
  const std::vector<int64_t>& piece_capacities() const { return piece_cap_; }

 private:
  bool fits(size_t i, int64_t elems, int64_t piece) const {
    return cap_[i] >= elems && cap_[i] <= 2 * elems && piece_cap_[i] >= piece;
  }
  void reclaim_oldest(const Reclaim& reclaim);
  std::vector<int64_t> cap_, piece_cap_;
  std::vector<bool> free_;
  std::vector<int> in_flight_;
};

class GradBuckets : public BlockHooks {
 public:
  // comm is null when dp == 1 (then nothing is communicated). zero: the ZeRO stage 0 to 3 (1 to 3 need comm).
  // wire: the dtype gradients travel in (parallel.grad_reduce); they are kept and summed into f32 either way.
  // reshard: ZeRO-3 frees a block's gathered parameters as soon as it is done with them. pp > 1: ZeRO-3 keeps them
  // for the step instead, and its gradients are whole buckets for the step, reduce-scattered once at the schedule's
  // allreduce_grads as under ZeRO-1 and freed after (torchtitan's choice: no per-micro-batch collectives).
  // expert_comm (parallel.ep): the ranks holding this rank's experts, over which the expert weights' buckets are
  // summed and (ZeRO) sharded; null when this rank's experts have no other copy (their buckets are kept whole).
  // ZeRO-3 keeps the FP8 linear weights (Param::fp8_weight) in units of their own; fp8_param_gather
  // (parallel.fp8_param_gather) gathers those as e4m3 codes with one tensorwise scale per weight. tp_comm: the
  // tensor-parallel group (null without one), over which a split weight's scale is agreed as Fp8Linear agrees it.
  GradBuckets(Backend& be, Communicator* comm, const std::vector<BucketParam>& params, BucketCaps caps,
              int zero = 0, GradReduce wire = GradReduce::fp32, bool reshard = true, int pp = 1,
              Communicator* expert_comm = nullptr, bool fp8_param_gather = false, Communicator* tp_comm = nullptr);
  bool params_sharded() const { return zero3_; }
  // Test only (RELAY_TEST_KILL_WHERE): SIGKILL this process right after it issues its next parameter all-gather.
  void test_kill_in_next_gather() { kill_in_gather_ = true; }
  bool sharded() const { return zero_; }
  // parallel.overlap, for the buckets reduced once a step (ZeRO 0, 1, and ZeRO-3 under pp > 1): launch each bucket
  // as soon as the last micro-batch's backward has written it (DDP's rule), in the order the backward fills them,
  // instead of at its chunk's allreduce_grads. micro_batches: the backward passes each chunk runs in a step (every
  // writer block's weight gradients then run that many times). Call before watch().
  void launch_when_filled(int micro_batches) { micro_batches_ = micro_batches; }
  // ZeRO-2, 3 (and launch_when_filled): learn which blocks write (and read) each bucket and hook the chunk's blocks
  // (before its first step).
  void watch(ModelChunk& chunk);
  void before_weight_grads(int block) override;
  void after_weight_grads(int block) override;
  void before_params(int block) override;
  void after_params(int block, bool backward_next) override;
  void prefetch_params(int block) override;
  // What the optimizer updates: every parameter whole, or (ZeRO) the pieces this replica owns.
  std::vector<OptimSlice> optimizer_slices() const;
  // A tied parameter's reduced gradient that the pair sums: its gradient, or (ZeRO) its owned piece.
  Tensor reduced_grad(Param* p);
  // ZeRO-1, 2: all-gather the updated parameters (blocking; with launch_when_filled each bucket's gather is only
  // issued, and waited for just before the next forward's first block that reads it, or at settle_params());
  // ZeRO-3: free any still gathered (they are stale).
  void gather_params();
  // ZeRO-1, 2 with launch_when_filled: the optimizer's update bucket by bucket (optimizer_slices' indices), in the
  // order the next forward reads the buckets, each bucket's parameter all-gather issued as soon as its pieces are
  // updated (Megatron-core's --overlap-param-gather); then gather_params() is not called. Empty otherwise.
  std::optional<UpdateGroups> update_groups();
  // ZeRO-1, 2 with launch_when_filled: wait for every parameter all-gather still in flight (before anything outside a
  // block's forward or backward reads the parameters: evaluation, checkpoints, checks).
  void settle_params();
  // ZeRO-3: let go of the head's parameters kept for a backward that does not come (after an evaluation's forward,
  // or before another block reads its parameters), but for the buckets in still_read.
  void release_kept(const std::vector<int>& still_read = {});
  void zero();                    // start of a step
  void launch_chunk(int chunk);   // allreduce_grads(chunk): start the chunk's all-reduces
  void progress();                // let MPI advance outstanding all-reduces
  void finish();                  // wait for every all-reduce (launching any not yet started)
  // This rank's share of the squared gradient norm (after finish), so that the sum over all ranks counts every
  // gradient once: its shards (ZeRO), or its whole buckets where it is the first of the ranks holding them.
  double norm_share();
  void scale(float s);
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // Seconds this rank waited on the buckets' collectives (reductions and gathers) since the last call: the exposed
  // communication of data parallelism.
  double take_waited_s() { return std::exchange(waited_s_, 0.0); }
  // Record each bucket's all-reduce (launch to completion) of this step in tracer (null: do not).
  void set_trace(Tracer* tracer, int64_t step) {
    tracer_ = tracer;
    trace_step_ = step;
  }

 private:
  struct Bucket {
    Communicator* comm = nullptr;  // the ranks that sum it (the replicas, or an expert's); null: none
    GradGroup group = GradGroup::dense;
    bool zero = false;             // ZeRO (1 to 3): sharded over comm (its size: `shards` below)
    Collective reduce = Collective::all_reduce;  // how allreduce_grads sums it: all-reduce, or (ZeRO) reduce-scatter
    bool wired = false;            // grad_reduce = "bf16": travels in bf16
    // (padded) every gradient of the bucket (padded to a multiple of shards under ZeRO); ZeRO-2 and 3: only when
    // not sharded, or (ZeRO-3 under pp > 1) during the step
    Tensor flat;
    int64_t padded = 0;
    Tensor values, shard;  // ZeRO-1, 2: (padded) the parameters; ZeRO: (padded / shards) this rank's summed gradients
    Tensor work;           // ZeRO-1, 2 under bf16: (padded) the parameters' bf16 working copies
    Tensor wire, wire_shard;  // grad_reduce = "bf16": (padded) and (padded / shards) bf16 copies that travel
    std::vector<std::pair<Param*, int64_t>> members;  // each parameter with its offset in flat
    std::vector<Shape> shapes;                         // each member's (tp shard's) shape
    Tensor master;       // ZeRO-3: (padded / shards) f32 this rank's piece of the parameters
    Tensor full;         // ZeRO-3: (padded) working dtype, the gathered parameters while in use (fp8: e4m3 codes)
    bool fp8 = false;    // ZeRO-3, parallel.fp8_param_gather: FP8 linear weights, gathered as e4m3 codes
    Tensor fp8_scales;   // fp8: (members, 1) f32 each member's tensorwise scale while gathered
    RequestPtr gather;   // ZeRO-3 (and ZeRO-1, 2 with launch_when_filled): the parameter all-gather in flight
    int users = 0;       // ZeRO-3: blocks running on the gathered parameters
    DType work_dtype = DType::f32;
    int chunk = 0;
    bool counts_in_norm = true;
    RequestPtr request;
    bool launched = false;
    bool widened = false;  // grad_reduce bf16: the wire's sum is back in the f32 gradients (finish() runs twice
                           // in a step with tied weights; the second must not undo the tied sum)
    int64_t launch_mark = 0;  // when traced
    Tracer* gather_tracer = nullptr;       // the parameter all-gather's, issued in a traced step (else nullptr),
    int64_t gather_mark = 0, gather_step = 0;  // and its issue's mark and step (its span ends where it is waited for)
    int buffer = -1;           // ZeRO-2: the pool buffer holding its gradients now, or -1
  };
  // ZeRO-2: a pooled gradient buffer and what its reduce-scatter sends and receives.
  struct PoolBuffer {
    Tensor flat, wire;          // (capacity) f32 gradients; bf16 copy (grad_reduce = "bf16")
    Tensor recv, wire_recv;     // (piece capacity) f32 this rank's piece of the sum; its bf16 form
    int bucket = -1;            // in flight for this bucket
    RequestPtr request;
    int64_t launch_mark = 0;
  };
  void launch(Bucket& b);
  // The optimizer's slices in order: bucket bi's member i, elements [a, e) of the bucket's flat layout that this
  // rank updates (the whole member where the bucket is not sharded). optimizer_slices and update_groups walk it.
  void for_each_slice(const std::function<void(size_t bi, size_t i, int64_t a, int64_t e)>& fn) const;
  std::vector<size_t> gather_order() const;  // ZeRO-1, 2: buckets in the order the next forward reads them
  void issue_gather(Bucket& b);              // ZeRO-1, 2: start its parameter all-gather
  // The trace's span of a parameter all-gather (track 1, "param gather bucket k"): from its issue to its wait's end.
  void trace_gather_issued(Bucket& b);
  void trace_gather_done(Bucket& b);
  const std::vector<int>& units_of(int block) const;  // ZeRO-3: the buckets block reads (none otherwise)
  void start_gather(Bucket& b);   // ZeRO-3: issue the unit's all-gather (if not gathered or in flight)
  void quantise_piece(Bucket& b);  // ZeRO-3, fp8: this rank's piece as e4m3 codes into full, each member's scale
  void finish_gather(Bucket& b);  // ZeRO-3: wait for it and point the parameters into it
  void release(Bucket& b);        // ZeRO-3: free the gathered parameters
  void reclaim(int buffer);       // ZeRO-2: wait for its reduce-scatter and add the piece into the shard
  // Points each member's field (grad, value or work) into flat (the bucket's layout).
  static void point(Bucket& b, const Tensor& flat, Tensor Param::*field);
  int64_t own_begin(const Bucket& b) const { return b.shard.numel() * b.comm->rank(); }
  Backend& be_;
  Communicator* comm_;
  Communicator* tp_comm_;  // fp8_param_gather under tensor parallelism: the scales' second max
  Sharding sharding_;  // what each group shards and moves (comm's replicas, expert_comm's copies)
  bool zero_;
  bool per_micro_batch_;  // ZeRO-2 and 3
  bool zero3_ = false, reshard_ = true;
  // ZeRO-3: the buckets the forward's last block let go of, kept gathered for its backward (FSDP keeps the root's
  // parameters so): released before any other block reads its parameters, so never more than two blocks' are held.
  std::vector<int> kept_;
  bool step_grads_ = false;  // ZeRO-3 under pp > 1: whole gradient buckets only during the step
  bool kill_in_gather_ = false;
  bool params_in_flight_ = false;  // ZeRO-1, 2 with launch_when_filled: gather_params' all-gathers not yet settled
  void settle(Bucket& b);          // ZeRO-1, 2: wait for the bucket's parameter all-gather, refresh its working copies
  double waited_s_ = 0;  // take_waited_s
  void wait_for(Request& r);  // r->wait(), timed into waited_s_
  bool bf16_wire_;
  std::vector<Bucket> buckets_;
  std::map<int, std::vector<int>> buckets_of_block_;  // ZeRO-2, 3: block index -> buckets it writes and reads
  std::vector<std::vector<int>> chunk_param_blocks_;  // ZeRO-2, 3: each watched chunk's parameter blocks
  std::map<int, std::vector<Zero2Write>> writes_;     // ZeRO-2: zero2_writes of the above
  std::map<Param*, int> bucket_of_;
  Zero2Pool pool_plan_;
  std::vector<PoolBuffer> pool_;
  // launch_when_filled: each block's buckets (the whole ones reduced once a step), and per bucket the weight-gradient
  // passes that write it in a step and those still to come in this one (at 0 it is launched).
  int micro_batches_ = 0;
  int64_t gather_spans_ = 0;  // traced parameter all-gathers so far: each one's async id past the buckets'
  std::map<int, std::vector<int>> fills_;
  std::vector<int> writes_per_step_, writes_left_;
  Tracer* tracer_ = nullptr;
  int64_t trace_step_ = 0;
};

}  // namespace relay
