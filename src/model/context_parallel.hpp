// Context parallelism (parallel.cp; Megatron-core, torchtitan, and Llama 3's all-gather form, Dubey et al.
// arXiv:2407.21783 sec. 3.3.2): every sequence of T tokens is cut into 2 cp chunks of c = T / (2 cp) rows, and rank i
// of a cp group holds chunks i and 2cp - 1 - i (the load-balanced causal layout: every rank gets the same amount of
// attention work), T / cp rows per sequence, in that order. Everything but attention is row-wise and runs on those
// rows alone. Attention all-gathers the group's keys and values into sequence order, runs this rank's queries at
// their positions against all of them (Backend::flash_attention_gqa_forward_at; the document mask too), and in the
// backward gathers them again (nothing of size T is kept between the passes), computes every key's gradient from
// this rank's queries, and reduce-scatters those back to the ranks that own the keys. With parallel.overlap the
// gathers travel (on the progress thread) while the queries attend to this rank's own rows; the rest follows once
// they arrive, and the two partials are merged as the online softmax does (FlashAttention arXiv:2205.14135).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"

namespace relay {

class Tracer;

class CpAttention;

// A rank's context-parallel group as a block sees it, and the one CpAttention its attention blocks share (they run
// one at a time, so one set of gathered keys and values serves them all). comm is null when size == 1.
struct ContextParallel {
  Communicator* comm = nullptr;
  int size = 1, rank = 0;
  std::shared_ptr<CpAttention> attention;
  bool on() const { return size > 1; }
};

// Whether context parallelism overlaps its key/value exchanges (parallel.overlap): on both backends (the CUDA one
// merges the two partial attentions with kernels/cuda/attention_merge.cu). Run setup and the memory plan ask.
inline bool cp_overlaps(bool overlap) { return overlap; }

// The position in its sequence (of T) of local row j (0 <= j < T / cp) of cp rank `rank`.
inline int64_t cp_position(int64_t T, int cp, int rank, int64_t j) {
  const int64_t c = T / (2 * cp);
  return j < c ? rank * c + j : (2 * cp - 1 - rank) * c + (j - c);
}

// Context-parallel attention and its scratch (the gathered keys and values, their gradients, the row permutations),
// allocated for the largest batch seen; one per rank, shared by its attention blocks and micro-batches.
class CpAttention {
 public:
  // overlap (parallel.overlap): the key/value all-gathers run non-blocking while the queries attend to this rank's
  // own rows (the causal diagonal work); false: gather first, then attend to all keys at once (the order before).
  CpAttention(Communicator* comm, int size, int rank, bool overlap = false)
      : comm_(comm), size_(size), rank_(rank), overlap_(overlap) {}
  // Record every exchange of this step into the trace (null: none), as spans on the communication track named
  // "cp all-gather k" / "cp reduce-scatter dv" (op cp_allgather / cp_reduce_scatter).
  void set_trace(Tracer* tracer, int64_t step) {
    tracer_ = tracer;
    trace_step_ = step;
  }
  bool overlaps() const { return overlap_; }
  // Seconds this rank's thread waited on the cp exchanges since the last call (exposed communication: with overlap
  // what the own rows' attention did not cover; without it every gather and reduce-scatter whole).
  double take_waited_s() { return std::exchange(waited_s_, 0.0); }
  // q (n, H*hd), k, v (n, KV*hd): this rank's rows (n = B x T / cp) -> out (n, H*hd), lse (B, H, T / cp). v's heads
  // may be of another width hd_v (DeepSeek-V3's MLA): v (n, KV*hd_v), out (n, H*hd_v).
  // q_pos (n) i32: each row's position in its sequence; doc_start (n) i32 or undefined: the document mask.
  void forward(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int64_t T, int64_t H, int64_t KV,
               const Tensor& q_pos, const Tensor& doc_start, Tensor& out, Tensor& lse);
  // dout, q, k, v, out, lse as above -> dq (n, H*hd), dk, dv (n, KV*hd): this rank's rows, the keys' gradients summed
  // over the group's queries.
  // meanwhile (optional): work that needs none of dq, dk, dv, run while the key-gradient reduce-scatters travel (with
  // overlap; after them without).
  void backward(Backend& be, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& lse, int64_t T, int64_t H, int64_t KV, const Tensor& q_pos, const Tensor& doc_start,
                Tensor& dq, Tensor& dk, Tensor& dv, const std::function<void()>& meanwhile = {});
  // The same for GPT's packed qkv (n, 3 Cl) = [q | k | v] of H heads (KV == H): the parts are copied into
  // contiguous scratch, and the backward's dq, dk, dv into dqkv's.
  void forward_packed(Backend& be, const Tensor& qkv, int64_t T, int64_t H, const Tensor& q_pos,
                      const Tensor& doc_start, Tensor& out, Tensor& lse);
  void backward_packed(Backend& be, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       int64_t T, int64_t H, const Tensor& q_pos, const Tensor& doc_start, Tensor& dqkv,
                       const std::function<void()>& meanwhile = {});
  // parallel.overlap: start the backward's key/value all-gathers of packed qkv (n, 3 Cl) now, at the start of the
  // block's backward, so that they travel behind the GEMMs that come before its attention (the MLP's and the output
  // projection's input gradients); the next backward_packed takes them instead of starting its own. The same bytes
  // gathered earlier: the results are unchanged. Without overlap, nothing.
  void prefetch_backward_packed(Backend& be, const Tensor& qkv, int64_t T);

 private:
  // The packed scratch for n rows of width w: q, k, v and their gradients (n, w) each.
  void prepare_packed(Backend& be, int64_t n, int64_t w, DType dt);
  // Keys (and their gradients) of width w, values of width wv.
  void prepare(Backend& be, int64_t n, int64_t T, int64_t w, int64_t wv, DType dt);
  // The rank-order buffer as (rows, w), w <= its width (keys' and values' widths may differ).
  Tensor rank_order(int64_t rows, int64_t w) const {
    return rank_order_.view({rank_order_.numel()}).rows(0, rows * w).view({rows, w});
  }
  // local (n, w) -> full (B*T, w) in sequence order: every rank's rows.
  void gather(Backend& be, const Tensor& local, Tensor& full, const char* what, const char* name);
  // full (B*T, w): this rank's contribution to every row -> local (n, w): its own rows summed over the group.
  void reduce_scatter(Backend& be, const Tensor& full, Tensor& local, const char* what, const char* name);
  void trace(const char* name, const char* op, int64_t begin);
  // parallel.overlap: forward / backward in two parts, own keys while the gathers travel, then the other ranks'.
  void forward_overlapped(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int64_t T, int64_t H,
                          int64_t KV, const Tensor& doc_start, Tensor& out, Tensor& lse);
  void backward_overlapped(Backend& be, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& lse, int64_t T, int64_t H, int64_t KV,
                           const Tensor& doc_start, Tensor& dq, Tensor& dk, Tensor& dv,
                           const std::function<void()>& meanwhile);
  // Starts the all-gather of local (n, w) into buf (cp n, w), rank order.
  RequestPtr start_gather(Backend& be, const Tensor& local, Tensor& buf, const char* what);
  // The document mask of the two parts from doc_start (n) (sequence positions): local_doc_ in the own rows'
  // order, remote_doc_ in the other ranks' rows' sequence order. Undefined tensors without a mask.
  void part_masks(Backend& be, const Tensor& doc_start, Tensor& local_doc, Tensor& remote_doc);
  // The number of this rank's rows of a sequence at positions before x.
  int64_t own_before(int64_t x) const;

  Communicator* comm_;
  int size_, rank_;
  Tracer* tracer_ = nullptr;
  int64_t trace_step_ = 0;
  int64_t n_ = 0, T_ = 0, w_ = 0, wv_ = 0;
  DType dt_ = DType::f32;
  Tensor to_sequence_, to_rank_;      // i32 (cp n): row permutations, rank order <-> sequence order
  Tensor rank_order_;                 // (cp n, max(w, wv)): the all-gather's and reduce-scatter's rank-order buffer
  Tensor k_, v_, dk_, dv_;            // (cp n, w), (cp n, wv), (cp n, w), (cp n, wv): sequence order
  Tensor pq_, pk_, pv_, pdq_, pdk_, pdv_;  // forward_packed / backward_packed: (n, Cl) each
  // parallel.overlap. The other ranks' rows of each sequence in sequence order ("remote order", T - T / cp a
  // sequence) are what the second part attends to.
  bool overlap_ = false;
  double waited_s_ = 0;  // take_waited_s
  // Waits for r, counting the time into waited_s_.
  void wait(const RequestPtr& r);
  Tensor rank_order_v_;                // (cp n, wv): the value all-gather's buffer (both gathers travel at once)
  Tensor rank_of_remote_;              // i32 ((cp-1) n): remote-order row -> rank-order row
  Tensor remote_of_rank_;              // i32 ((cp-1) n): rank-order rows but this rank's, in order -> remote row
  Tensor remote_pos_;                  // i32 (n): each local query's last visible position in remote order (-1: none)
  Tensor local_doc_, remote_doc_;      // i32 (n), i32 (n): the document masks of the two parts
  Tensor out2_, lse2_, dq2_;           // (n, H*hd_v), f32 (B, H, T / cp), (n, H*hd): the second part's
  Tensor dkl_, dvl_;                   // (n, w), (n, wv): the own keys' gradients from this rank's queries
  RequestPtr early_k_, early_v_;       // prefetch_backward_packed's gathers in flight (into rank_order_, rank_order_v_)
  int64_t early_mark_ = 0;             // when they started (traced)
};

}  // namespace relay
