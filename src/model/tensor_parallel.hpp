// Tensor parallelism (Megatron-LM: Shoeybi et al., arXiv:1909.08053): how a parameter is split over the
// tp ranks of a stage, and the group's context the blocks use for their collectives.
//
// A split names one dimension of the parameter's torch shape and a number of equal segments along it
// (3 for GPT's fused QKV weight, whose rows are [q; k; v]); tp rank r holds, of every segment, the
// indices [r * n / tp, (r + 1) * n / tp), n the segment's length. Column-parallel weights split dim 0
// (their output features), row-parallel weights dim 1 (their input features), vocabulary-parallel
// embeddings dim 0 (the vocabulary, which need not divide: shards may differ by one row).
// Checkpoints hold whole tensors; these functions cut a shard out of one and put it back.
//
// Sequence parallelism (parallel.sequence_parallel; Korthikanti et al., arXiv:2205.05198): the activations between
// blocks are split by rows, tp rank r holding rows [r n / tp, (r + 1) n / tp) of a micro-batch's n; the norms,
// residual adds and row-parallel biases run on those rows alone. A block all-gathers its norm's output before a
// column-parallel projection and reduce-scatters a row-parallel projection's partial sums (instead of all-reducing
// them); the backward mirrors both. Norm weights see 1/tp of the rows, so their gradients are summed over the group.
//
// Asynchronous input-gradient all-reduce (parallel.overlap, issue 40; Megatron-LM's async_grad_allreduce, Narayanan et
// al., arXiv:2104.04473): without sequence parallelism a column-parallel layer's input gradient is all-reduced
// non-blocking while the layer's own weight gradient is computed (allreduce_sum_during), where the block's B and W run
// back to back (Block::backward). The same sums reach the same buffers: bitwise equal to the order without overlap.
// Under sequence parallelism the same (Megatron-LM's sequence-parallel backward): the input gradient's reduce-scatter is
// started non-blocking and the weight gradient computed while it travels (reduce_scatter_during), its operand's rows
// gathered into a second buffer (sp_async_rows) by a gather started before the input-gradient GEMM (start_gather_rows).
// column_input_grad makes that choice for every block (all-reduce or reduce-scatter, now or while dW is computed).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/tensor.hpp"
#include "model/fp8_linear.hpp"

namespace relay {

struct TpSplit {
  int dim = -1;   // -1: replicated on every tp rank
  int parts = 1;  // equal segments along dim, each split over the tp ranks
  bool replicated() const { return dim < 0; }
};

// [begin, end) of tp rank r's share of n indices.
inline int64_t tp_begin(int64_t n, int tp, int r) { return n * r / tp; }
inline int64_t tp_end(int64_t n, int tp, int r) { return n * (r + 1) / tp; }

// The shape tp rank r holds of a tensor of shape `full`.
Shape shard_shape(const Shape& full, TpSplit s, int tp, int r);
// full (host, numel(full)) -> shard (host, numel(shard_shape)) and back.
void extract_shard(const float* full, const Shape& full_shape, TpSplit s, int tp, int r, float* shard);
void insert_shard(const float* shard, const Shape& full_shape, TpSplit s, int tp, int r, float* full);

// A stage's tensor-parallel group as a block sees it. comm is null when size == 1.
struct TensorParallel {
  Communicator* comm = nullptr;
  int size = 1, rank = 0;
  // Sequence parallelism: the rank's one buffer of a micro-batch's every row (n, C), shared by its blocks (they use it
  // one collective at a time); null without it.
  std::shared_ptr<Tensor> sp_rows;
  // Sequence parallelism with overlap: a second such buffer (n, C), where a weight gradient's operand is gathered while
  // the input gradient's partial sums in sp_rows are reduce-scattered; null otherwise.
  std::shared_ptr<Tensor> sp_async_rows;
  // parallel.overlap on the CPU backend (the communicator then progresses on the progress thread): the blocks' fused
  // backward hides an input gradient's all-reduce behind the layer's weight gradients (async_input_grads).
  bool overlap = false;
  // parallel.overlap: the same group duplicated (its own MPI communicator), whose requests progress on the progress
  // thread: the collectives that travel while the rank computes (allreduce_sum_during, the collective matmul's ring)
  // go there; those waited for at once stay on comm, where MPI's own blocking wait drives them at full speed (a
  // progress thread that polls would slow a large transfer over TCP). Null: comm for everything.
  Communicator* async_comm = nullptr;
  Communicator* overlap_comm() const { return async_comm ? async_comm : comm; }
  // Seconds this rank's thread waited on the group's collectives (exposed communication), shared by the blocks; null:
  // not counted.
  std::shared_ptr<double> waited_s;
  bool on() const { return size > 1; }
  bool sequence_parallel() const { return sp_rows != nullptr; }
  // Whether a block running B and W together all-reduces (reduce-scatters, under sequence parallelism) a
  // column-parallel input gradient while its weight gradients are computed. Under sequence parallelism only with the
  // second buffer (the weight gradient's gathered operand must not sit in the buffer the reduce-scatter reads).
  bool async_input_grads() const { return overlap && on() && (!sequence_parallel() || sp_async_rows != nullptr); }
  // Whether the forward's all-gathers before column-parallel GEMMs and reduce-scatters after row-parallel ones run as
  // collective matmuls (model/collective_matmul.hpp): under sequence parallelism with overlap, and not for a block's
  // FP8 GEMMs (gemm on), whose tensorwise scale is the whole gathered operand's.
  bool collective_matmul(const Fp8Linear& gemm) const { return overlap && sequence_parallel() && !gemm.on(); }
  // In-place sum over the group (blocking, watched); nothing when size == 1. `what` names it for the
  // watchdog ("the attention output all-reduce").
  void allreduce_sum(Tensor& t, const char* what) const;
  void allreduce_max(Tensor& t, const char* what) const;
  // The same sum started non-blocking, `meanwhile` run on this thread while it travels (the layer's weight gradients,
  // which must not touch t), then waited on (watched and named as allreduce_sum's). Nothing but meanwhile when
  // size == 1.
  void allreduce_sum_during(Tensor& t, const char* what, const std::function<void()>& meanwhile) const;
  // Waits on req (named `what` for the watchdog), the time added to waited_s: every wait on the group's collectives.
  void wait(Request& req, const char* what) const;
  // The waited seconds since the last call (0 when not counted).
  double take_waited_s() const;

  // Sequence parallelism. The shared buffer as (n, w), grown (counted as activations) when smaller: where a
  // row-parallel projection writes its partial sums for reduce_scatter_rows, or a gather lands.
  Tensor full_rows(Backend& be, int64_t n, int64_t w, DType dt) const;
  // local (m, w), this rank's rows -> (tp m, w): the group's rows in order, in the shared buffer (valid until its
  // next use).
  Tensor gather_rows(Backend& be, const Tensor& local, const char* what) const;
  // full (tp m, w) partial sums over the group -> local (m, w): this rank's rows, summed.
  void reduce_scatter_rows(const Tensor& full, Tensor& local, const char* what) const;
  // local (m, w) -> the group's rows (gather_rows) under sequence parallelism, else local itself.
  Tensor all_rows(Backend& be, const Tensor& local, const char* what) const {
    return sequence_parallel() ? gather_rows(be, local, what) : local;
  }
  // Sequence parallelism with overlap (sp_async_rows): local (m, w) this rank's rows -> the group's rows (tp m, w) in
  // the second buffer, an all-gather started non-blocking on overlap_comm(); finish_gather waits for it (watched,
  // named `what`) and returns the rows (valid until the next start_gather_rows).
  struct PendingGather {
    Tensor full;  // (tp m, w)
    RequestPtr req;
    const char* what = nullptr;
  };
  PendingGather start_gather_rows(Backend& be, const Tensor& local, const char* what) const;
  Tensor finish_gather(PendingGather& g) const;
  // reduce_scatter_rows started non-blocking on overlap_comm() (the same MPI call: the same sums), `meanwhile` run on
  // this thread while it travels (it must not touch full or local), then waited on.
  void reduce_scatter_during(const Tensor& full, Tensor& local, const char* what,
                             const std::function<void()>& meanwhile) const;
  // A row-parallel projection's partial sums, x (n, in / tp) @ W^T -> y: all-reduced into y (n, out), or under
  // sequence parallelism computed into the shared buffer (n, out) and reduce-scattered into y (n / tp, out); with
  // overlap, a forward's (trans_w, not FP8) chunk by chunk around the reduce-scatter ring (matmul_reduce_scatter).
  // gemm: the block's linear GEMMs (FP8 under train.precision = "fp8"; trans_w: a forward, else an input gradient).
  // `of` names what is summed ("the attention output"); the watchdog's name adds " all-reduce" or " reduce-scatter".
  void row_parallel_matmul(Backend& be, const Tensor& x, const Fp8Weight& w, bool trans_w, Tensor& y, const char* of,
                           const Fp8Linear& gemm = Fp8Linear()) const;
  // A sum over the group of partial sums of a micro-batch's n rows into out (m, C): partial(sums) writes this rank's
  // (n, C) into out itself, then all-reduced, or under sequence parallelism into the shared buffer, then
  // reduce-scattered into out's m = n / tp rows (named `of` and the collective, as row_parallel_matmul's). The
  // experts' output and input gradient (every tp rank runs its share of every expert on the group's rows) and
  // column_input_grad's sum when nothing overlaps it.
  void sum_rows(Backend& be, Tensor& out, int64_t n, const char* of,
                const std::function<void(Tensor& sums)>& partial) const;
  // A column-parallel layer's input gradient dx (m, C), summed over the group (GPT's c_attn and c_fc, Llama's q, k, v
  // and gate, up, MLA's q and gate, up): partial(sums) writes this rank's partial sums of the n rows (n, C) (its
  // share of the output features' terms, the GEMMs dy_i (n, out_i / tp) @ W_i) into sums, dx itself or under sequence
  // parallelism the shared buffer, then all-reduced into dx (reduce-scattered into dx's m = n / tp rows; named `of`
  // and the collective, as row_parallel_matmul's). early (a block running B and W together, async_input_grads()):
  // the sum travels while weights(x_all) computes the layer's weight gradients (which backward_weight then skips):
  // the same sums, started earlier. x (m, C) is the layer's saved input rows; x_all the group's (n, C) under sequence
  // parallelism, gathered (named gather_what) into the second buffer while partial runs (the reduce-scatter reads the
  // first), else x itself.
  void column_input_grad(Backend& be, Tensor& dx, int64_t n, const char* of,
                         const std::function<void(Tensor& sums)>& partial, bool early, const Tensor& x,
                         const char* gather_what, const std::function<void(const Tensor& x_all)>& weights) const;
};

// Sequence parallelism: a block's norm-weight gradients of one micro-batch, each from this rank's rows only, summed
// over the tp group before they are added to the parameters' (so every tp rank holds the whole model's gradient of
// its replicated norm weights; without the sum each would see 1/tp of the rows).
class SpNormGrads {
 public:
  // Up to 4 vectors of C f32 (counted as activations); once.
  void allocate(Backend& be, int64_t C);
  // Zeroes the parts; part(i) (C) f32 then takes this micro-batch's gradients.
  void begin(Backend& be);
  Tensor part(int i) { return buf_.rows(i, 1).view({buf_.size(1)}); }
  // The group's sum, added into grads[i] (each (C) f32; undefined: dropped, e.g. an absent LayerNorm bias).
  void finish(Backend& be, const TensorParallel& tp, const std::vector<Tensor*>& grads);

 private:
  Tensor buf_;  // (4, C) f32
};

// Whether tensor parallelism overlaps its input-gradient all-reduces (parallel.overlap): on the CPU backend only for
// now (on CUDA the collectives keep today's order; an NCCL-stream version would order them by events instead).
inline bool tp_overlaps(bool overlap, Device device) { return overlap && device != Device::cuda; }

// Bytes of a rank's sequence-parallel buffer (TensorParallel::full_rows) for micro-batches of n rows of width C.
inline int64_t sp_rows_bytes(int64_t n, int64_t C, DType dt) { return n * C * int64_t(dtype_size(dt)); }

}  // namespace relay
