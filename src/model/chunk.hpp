// A model chunk: the contiguous slice of blocks one pipeline stage (or, interleaved, one virtual
// stage) holds, with the activation and gradient buffers of every micro-batch in flight.
// A micro-batch's buffers are a slot: with the schedule's slot plan (parallel/slot_plan.hpp)
// micro-batches that are never alive at once share one, so 1F1B holds pp - rank of them, not m. The
// two buffers that leave the rank asynchronously (the output sent forward, the input gradient sent
// back) are per micro-batch instead, so a send in flight is never overwritten. Buffers are allocated
// on first use and reused for every later step (no steady-state allocation). Every method takes the
// micro-batch (m: evaluation). Backward is split into backward_input (B) and backward_weight (W) for zero-bubble
// schedules (Qi et al., arXiv:2401.10241); backward() runs both, block by block.
//
// Backward buffers (BufferSpec::backward: what backward_input leaves for backward_weight, and backward scratch): a
// zero-bubble schedule runs a micro-batch's B and W apart, so every slot keeps its own; every other schedule runs them
// block by block (backward()), so the chunk's blocks and slots share one set (SharedBuffers), sized by the largest.
//
// Activation recomputation (train.recompute = "blocks"; Chen et al., arXiv:1604.06174, as Megatron-LM's
// full recomputation): a transformer block keeps nothing per micro-batch but its input; its forward
// writes its intermediates into one scratch set shared by every slot, and its backward runs the forward
// again from the kept input first. Needs B and W together (not zero-bubble schedules).
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "model/block.hpp"

namespace relay {

// Bytes a chunk allocates for its activations (ModelChunk::slot): per slot, per micro-batch (the
// boundary buffers sent to other ranks) and once (the recomputed blocks' shared scratch).
struct ChunkBytes {
  int64_t slot = 0, boundary = 0, scratch = 0;
};

// ModelChunk::planned_bytes block by block: what each block adds to a chunk (its output and gradient, saved buffers,
// recomputation's sets, its keys among the shared backward buffers) built once, so the bytes of every chunk [begin, end)
// of one model's blocks cost one pass from each begin (the pipeline partition's memory term, parallel/partition.hpp,
// asks for all of them) instead of one pass over the chunk's blocks each. ModelChunk::planned_bytes is one walk.
class ChunkBytesPlanner {
 public:
  ChunkBytesPlanner(std::span<const BlockSpec> blocks, int tp, int tp_rank, int64_t rows, bool recompute,
                    bool split_backward, bool documents = false, int cp = 1);
  // The running sums of a chunk from `begin` through the blocks added so far.
  struct Walk {
    int64_t act = 0, slot = 0, boundary = 0, norm_grads = 0, moe_set = 0, dense_set = 0, scratch_out = 0, shared = 0;
    int64_t last_out = 0;            // the last block's output elements
    std::vector<char> seen;          // (shared keys) held by the chunk's backward buffers
    // The chunk's bytes with the blocks added so far as its blocks.
    ChunkBytes bytes(bool is_last, bool alias_output_grad) const;
  };
  Walk start(int begin, bool is_first) const;
  void add(Walk& w, int block) const;  // the blocks in order from begin
  int size() const { return int(blocks_.size()); }

 private:
  struct Block {
    int64_t in_bytes = 0;     // the input the chunk keeps (token ids: one i32 a row)
    int64_t in_grad = 0;      // its input's gradient (none for token ids)
    int64_t act = 0;          // its dtype's bytes (a chunk's first block's sizes every output of the chunk)
    int64_t out = 0;          // output elements
    bool recomputed = false, moe = false;
    int64_t set = 0;          // recomputed: its saved bytes (one set per kind of block)
    int64_t own = 0;          // not recomputed: its saved bytes kept per slot
    std::vector<std::pair<int, int64_t>> shared;  // not recomputed, not split: its backward buffers (key, bytes)
    int64_t norm_grads = 0;
  };
  std::vector<Block> blocks_;
  int keys_ = 0;
  int64_t rows_ = 0, sequence_bytes_ = 0;  // the sequence layout's i32s per slot
};

// Bytes of a rank's CpAttention (model/context_parallel.hpp) for micro-batches of `rows` of its rows: the gathered
// keys, values, their gradients and the rank-order buffer (cp x rows each), two permutations, and for GPT's packed
// attention its q, k, v and gradients (rows each). 0 without context parallelism or attention blocks.
// overlap (parallel.overlap): besides, the buffers of the two-part attention (model/context_parallel.cpp).
int64_t cp_attention_bytes(std::span<const BlockSpec> blocks, int tp, int cp, int64_t rows, bool overlap = false);

// What runs around a block's work (ZeRO-2 and 3, parallel/data_parallel.hpp); `block` is BlockSpec::index.
// before/after_weight_grads: the block is about to accumulate its parameter gradients of a micro-batch, and has.
// before/after_params: the block is about to read its parameters (its forward, or its backward: the recomputed
// forward and the input gradient), and is done with them; prefetch_params: the block that runs next will.
// backward_next: the last chunk's last block with parameters ends its forward, and its backward may come next (the
// same parameters read again at once).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_weight_grads(int block) = 0;
  virtual void after_weight_grads(int block) = 0;
  virtual void before_params(int) {}
  virtual void after_params(int, bool /*backward_next*/) {}
  virtual void prefetch_params(int) {}
};

class ModelChunk {
 public:
  // What a chunk of these blocks would allocate for `rows` rows on tp rank tp_rank of tp, before anything
  // exists (relay plan's memory prediction): the same rules as slot() below.
  // documents: data.document_mask (two i32 per row and slot); cp: context parallelism's size (rows are this rank's;
  // a third i32 per row; the gathered keys and values are the rank's, cp_attention_bytes).
  // (ChunkBytesPlanner below, over these blocks alone.)
  static ChunkBytes planned_bytes(std::span<const BlockSpec> blocks, int tp, int tp_rank, int64_t rows,
                                  bool is_first, bool is_last, bool alias_output_grad, bool recompute,
                                  bool split_backward, bool documents = false, int cp = 1);

  // alias_output_grad: the output gradient is written over the output (the last chunk of a model
  // whose loss computes its gradient in place, so a vocabulary-sized logits buffer exists once).
  // split_backward: the schedule calls backward_input and backward_weight apart (zero-bubble); otherwise only
  // backward(), and the blocks share their backward buffers.
  ModelChunk(Backend& be, int id, std::vector<std::unique_ptr<Block>> blocks, bool is_first, bool is_last,
             bool alias_output_grad = false, bool recompute = false, bool split_backward = false);
  int id() const { return id_; }
  bool is_first() const { return is_first_; }
  bool is_last() const { return is_last_; }
  int64_t in_width() const { return blocks_.front()->spec().in; }  // 0: token ids
  int64_t out_width() const { return blocks_.back()->out_width(); }
  const std::vector<std::unique_ptr<Block>>& blocks() const { return blocks_; }
  std::vector<Param*> params();  // in block order, each Param once
  // Which slot each micro-batch 0..m-1 uses (SlotPlan::slot_of); without one, a slot per micro-batch.
  void set_slot_plan(std::vector<int> slot_of_micro_batch) { slot_of_ = std::move(slot_of_micro_batch); }
  // Called around every block's parameter-gradient work from now on (null: nothing).
  void set_hooks(BlockHooks* hooks) { hooks_ = hooks; }

  // `rows` is always the micro-batch's rows (tokens); under sequence parallelism the activations between blocks hold
  // rows / tp of them (BlockSpec::sp), and the views below are that size.
  // Where this micro-batch's input goes: (rows, in), or i32 (rows) token ids for a chunk starting with the embedding.
  Tensor input(int mb, int64_t rows);
  // Runs every block; returns the output (rows, out).
  Tensor forward(int mb, int64_t rows);
  // The last forward's output (rows, out) and the last backward's input gradient (rows, in).
  Tensor forward_output(int mb, int64_t rows);
  Tensor input_grad(int mb, int64_t rows);
  // Where this micro-batch's output gradient goes (rows, out): from the loss or received from the next chunk.
  Tensor output_grad(int mb, int64_t rows);
  // B: input gradients through every block; returns d input (rows, in), undefined for the first chunk.
  Tensor backward_input(int mb, int64_t rows);
  // W: parameter gradients of every block from the saved inputs and output gradients.
  void backward_weight(int mb, int64_t rows);
  // B and W together, block by block from the last.
  Tensor backward(int mb, int64_t rows);
  // This micro-batch's sequence layout (Block::set_documents): per-row document starts, positions and (context
  // parallelism) places in the sequence, host arrays of `rows` each or null; uploaded into its slot, and every later
  // forward and backward of the micro-batch hands them to the blocks.
  void set_documents(int mb, int64_t rows, const int32_t* doc_start, const int32_t* positions,
                     const int32_t* q_pos = nullptr);

 private:
  struct Slot {
    int64_t capacity = 0;
    std::vector<Tensor> acts;   // acts[k]: input of block k (rows, width); acts[L] the output
    std::vector<Tensor> grads;  // grads[k]: gradient w.r.t. acts[k]
    std::vector<BlockSaved> saved;
    Tensor doc_start, positions, q_pos;  // the sequence layout: i32 (capacity) each, or undefined
  };
  struct Boundary {  // per micro-batch: what is sent to other ranks
    int64_t capacity = 0;
    Tensor out, in_grad;  // (rows, out) unless the last chunk; (rows, in) unless the first
  };
  // The micro-batch's slot, with its boundary buffers in acts[L] and grads[0].
  Slot& slot(int mb, int64_t rows);
  // Rows of block k's input and output for a micro-batch of `rows` rows (fewer under sequence parallelism).
  int64_t in_rows(size_t k, int64_t rows) const { return block_in_rows(blocks_[k]->spec(), rows); }
  int64_t out_rows(size_t k, int64_t rows) const { return block_out_rows(blocks_[k]->spec(), rows); }
  // acts[k] and grads[k] of the slot for a micro-batch of `rows` rows: (in_rows(k), width), k = L: the output.
  Tensor act(Slot& sl, size_t k, int64_t rows);
  Tensor grad(Slot& sl, size_t k, int64_t rows);
  bool needs_input_grad(size_t k) const;
  // Where block k keeps its intermediates for this slot: the slot's own set, or the shared scratch.
  BlockSaved& saved(Slot& sl, size_t k);
  // Block k about to run on the slot's micro-batch: its document layout, when there is one.
  void hand_documents(Slot& sl, size_t k, int64_t rows);
  // Block k's backward_weight, between the hooks.
  void weight_grads(size_t k, const Tensor& x, const Tensor& dy, BlockSaved& sv);
  // The parameter hooks around block k's use of its parameters; `next` the block visited after it (-1: none).
  void params_in(size_t k, int64_t next);
  void params_out(size_t k, bool forward = false);  // forward: this is the forward's (its last block may be kept)

  Backend& be_;
  int id_;
  std::vector<std::unique_ptr<Block>> blocks_;
  bool is_first_, is_last_, alias_output_grad_, split_backward_;
  SharedBuffers shared_;  // the blocks' backward buffers, unless split_backward_
  size_t first_param_block_;  // in the first chunk, no gradient is needed below this block
  std::vector<Slot> slots_;
  std::vector<Boundary> boundaries_;  // by micro-batch
  std::vector<int> slot_of_;
  std::vector<bool> recomputed_;  // per block
  // The recomputed blocks' intermediates, for scratch_rows_ rows: one set per kind of recomputed block (a MoE
  // model's dense and sparse decoder layers keep different buffers), scratch_of_[k] block k's.
  std::vector<BlockSaved> scratch_;
  std::vector<size_t> scratch_of_;
  Tensor scratch_out_;            // (scratch_rows_, C) a recomputed forward's output
  int64_t scratch_rows_ = 0;
  bool documents_ = false;  // set_documents was called: every slot carries a document layout
  BlockHooks* hooks_ = nullptr;
};

}  // namespace relay
