// Forward, backward-input and backward-weight over a chunk's blocks with per-slot buffers.
#include "model/chunk.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "core/memory.hpp"
#include "model/block_cost.hpp"
#include "model/model_spec.hpp"

namespace relay {

ModelChunk::ModelChunk(Backend& be, int id, std::vector<std::unique_ptr<Block>> blocks, bool is_first, bool is_last,
                       bool alias_output_grad, bool recompute, bool split_backward)
    : be_(be), id_(id), blocks_(std::move(blocks)), is_first_(is_first), is_last_(is_last),
      alias_output_grad_(alias_output_grad), split_backward_(split_backward) {
  RELAY_ASSERT(!blocks_.empty(), "chunk " << id << " has no blocks");
  std::vector<bool> kinds;  // by scratch set: whether its blocks have experts
  for (auto& b : blocks_) {
    recomputed_.push_back(recompute && b->spec().recomputable);
    const bool moe = b->spec().moe.on();
    auto it = std::find(kinds.begin(), kinds.end(), moe);
    scratch_of_.push_back(size_t(it - kinds.begin()));
    if (it == kinds.end()) kinds.push_back(moe);
  }
  scratch_.resize(kinds.size());
  first_param_block_ = blocks_.size();
  for (size_t k = 0; k < blocks_.size(); ++k)
    if (!blocks_[k]->params().empty()) { first_param_block_ = k; break; }
}

std::vector<Param*> ModelChunk::params() {
  std::vector<Param*> out;
  std::set<Param*> seen;
  for (auto& b : blocks_)
    for (Param* p : b->params())
      if (seen.insert(p).second) out.push_back(p);
  return out;
}

bool ModelChunk::needs_input_grad(size_t k) const {
  // The first chunk's input is data: blocks up to and including the first parametrised one need no dx.
  return !(is_first_ && k <= first_param_block_) && blocks_[k]->spec().in > 0;
}

ChunkBytesPlanner::ChunkBytesPlanner(std::span<const BlockSpec> blocks, int tp, int tp_rank, int64_t rows,
                                     bool recompute, bool split_backward, bool documents, int cp)
    : rows_(rows) {
  // The sequence layout: document starts (document mask), positions (either), places in the sequence (cp).
  sequence_bytes_ = 4 * rows * ((documents ? 1 : 0) + (documents || cp > 1 ? 1 : 0) + (cp > 1 ? 1 : 0));
  std::map<SharedBuffers::Key, int> keys;
  for (const BlockSpec& s : blocks) {
    Block b;
    b.act = int64_t(dtype_size(s.dtype));
    b.in_grad = b.act * block_in_rows(s, rows) * s.in;
    b.in_bytes = s.in == 0 ? 4 * rows : b.in_grad;
    b.out = block_out_rows(s, rows) * block_out_width(s, tp, tp_rank);
    b.moe = s.moe.on();
    b.recomputed = recompute && s.recomputable;
    if (b.recomputed) b.set = saved_bytes(s, rows, tp);
    else {
      const std::vector<BufferSpec> specs = saved_shapes(s, rows, tp);
      for (size_t i = 0; i < specs.size(); ++i) {
        if (split_backward || !specs[i].backward) b.own += specs[i].bytes();
        if (!split_backward && specs[i].backward) {
          const int id = keys.try_emplace(SharedBuffers::key(i, specs[i]), int(keys.size())).first->second;
          b.shared.push_back({id, specs[i].bytes()});
        }
      }
    }
    // Sequence parallelism: a block's norm-weight gradients of a micro-batch before the group's sum (4 x C f32).
    if (s.sp > 1 && (s.kind == BlockKind::transformer || s.kind == BlockKind::llama_layer || s.kind == BlockKind::head))
      b.norm_grads += 4 * s.in * 4;
    // Tensor parallelism with q_norm / k_norm (Qwen3): their gradients from this rank's heads before the sum (4 x hd).
    if (tp > 1 && s.qk_norm) b.norm_grads += 4 * head_dim(s) * 4;
    blocks_.push_back(std::move(b));
  }
  keys_ = int(keys.size());
}

ChunkBytesPlanner::Walk ChunkBytesPlanner::start(int begin, bool is_first) const {
  const Block& first = blocks_.at(size_t(begin));
  Walk w;
  w.act = first.act;
  w.slot = first.in_bytes + sequence_bytes_;    // the input and the sequence layout
  if (!is_first) w.boundary = first.in_grad;  // the input gradient sent back
  w.seen.assign(size_t(keys_), 0);
  return w;
}

void ChunkBytesPlanner::add(Walk& w, int block) const {
  const Block& b = blocks_[size_t(block)];
  w.last_out = b.out;
  w.slot += w.act * b.out * 2;  // output and its gradient (Walk::bytes takes the last block's back where sent on)
  if (b.recomputed) {           // one set per kind of block (with or without experts) and one output
    (b.moe ? w.moe_set : w.dense_set) = b.set;
    w.scratch_out = w.act * b.out;
  } else {
    w.slot += b.own;
    for (const auto& [key, bytes] : b.shared)
      if (!w.seen[size_t(key)]) w.seen[size_t(key)] = 1, w.shared += bytes;
  }
  w.norm_grads += b.norm_grads;
}

ChunkBytes ChunkBytesPlanner::Walk::bytes(bool is_last, bool alias_output_grad) const {
  ChunkBytes b;
  const bool sent = !is_last;
  b.slot = slot - (alias_output_grad || sent ? act * last_out : 0);  // the output's gradient aliased, or sent on
  b.boundary = boundary + (sent ? act * last_out : 0);                 // the output sent on
  b.scratch = moe_set + dense_set + scratch_out + norm_grads + shared;
  return b;
}

ChunkBytes ModelChunk::planned_bytes(std::span<const BlockSpec> blocks, int tp, int tp_rank, int64_t rows,
                                     bool is_first, bool is_last, bool alias_output_grad, bool recompute,
                                     bool split_backward, bool documents, int cp) {
  const ChunkBytesPlanner planner(blocks, tp, tp_rank, rows, recompute, split_backward, documents, cp);
  ChunkBytesPlanner::Walk w = planner.start(0, is_first);
  for (int k = 0; k < planner.size(); ++k) planner.add(w, k);
  return w.bytes(is_last, alias_output_grad);
}

int64_t cp_attention_bytes(std::span<const BlockSpec> blocks, int tp, int cp, int64_t rows, bool overlap) {
  if (cp <= 1) return 0;
  for (const BlockSpec& s : blocks) {  // every attention block of a model has the same widths
    const AttentionShape a = attention_shape(s);
    if (!a.on()) continue;
    const int64_t w = a.kv_heads / tp * a.head_dim, act = int64_t(dtype_size(s.dtype)), gathered = cp * rows;
    // parallel.overlap: the value gather's own buffer (cp x rows), the own keys' and values' gradients (rows), the
    // remote part's out, dq and lse (rows x the rank's query heads), two remote-order permutations and three i32
    // per local row (positions, the two parts' document starts).
    const int64_t hq = a.heads / tp;
    const int64_t overlapped = overlap ? gathered * w * act + 2 * rows * w * act + 2 * rows * hq * a.head_dim * act +
                                             rows * hq * 4 + 2 * (gathered - rows) * 4 + 3 * rows * 4
                                       : 0;
    return 5 * gathered * w * act + 2 * gathered * 4 + (a.packed_qkv ? 6 * rows * w * act : 0) + overlapped;
  }
  return 0;
}

ModelChunk::Slot& ModelChunk::slot(int mb, int64_t rows) {
  RELAY_ASSERT(mb >= 0, "negative micro-batch");
  const size_t L = blocks_.size(), m = slot_of_.size();
  // Planned micro-batches share the plan's slots (all below m). Evaluation (mb = m) runs between steps, when no
  // micro-batch is in flight, on micro-batches of the training's size: it takes micro-batch 0's slot and boundary
  // buffers, so it allocates nothing. Without a plan, a slot per micro-batch.
  const size_t b = m > 0 && static_cast<size_t>(mb) >= m ? 0 : static_cast<size_t>(mb);
  const size_t s = m > 0 ? static_cast<size_t>(slot_of_[b]) : b;
  if (s >= slots_.size()) slots_.resize(s + 1);
  if (b >= boundaries_.size()) boundaries_.resize(b + 1);
  MemoryScope scope(MemKind::activations);
  const DType dt = blocks_.front()->spec().dtype;  // activations and their gradients
  Boundary& bd = boundaries_[b];
  if (bd.capacity < rows) {
    bd.capacity = rows;
    if (!is_last_) bd.out = Tensor(be_, {out_rows(L - 1, rows), out_width()}, dt);
    if (!is_first_) bd.in_grad = Tensor(be_, {in_rows(0, rows), in_width()}, dt);
  }
  Slot& sl = slots_[s];
  if (sl.capacity < rows) {  // first use (or a larger eval batch): allocate once, reuse afterwards
    sl.capacity = rows;
    sl.acts.assign(L + 1, Tensor());
    sl.grads.assign(L + 1, Tensor());
    sl.saved.assign(L, BlockSaved());
    sl.acts[0] = in_width() == 0 ? Tensor(be_, {rows}, DType::i32) : Tensor(be_, {in_rows(0, rows), in_width()}, dt);
    for (size_t k = 0; k < L; ++k) {
      const int64_t w = blocks_[k]->out_width(), r = out_rows(k, rows);
      const bool boundary = k + 1 == L && !is_last_;  // the output sent on lives in the micro-batch's buffer
      if (!boundary) sl.acts[k + 1] = Tensor(be_, {r, w}, dt);
      sl.grads[k + 1] = (k + 1 == L && alias_output_grad_) ? sl.acts[k + 1] : Tensor(be_, {r, w}, dt);
      if (recomputed_[k]) continue;
      sl.saved[k].shared = split_backward_ ? nullptr : &shared_;  // B and W together: one set for every block
      blocks_[k]->allocate_saved(be_, rows, sl.saved[k]);
    }
    if (scratch_rows_ < rows) {  // each recomputed block sizes its kind's scratch set (the kind's blocks share shapes)
      for (size_t k = 0; k < L; ++k)
        if (recomputed_[k]) {
          blocks_[k]->allocate_saved(be_, rows, scratch_[scratch_of_[k]]);
          scratch_out_ = Tensor(be_, {out_rows(k, rows), blocks_[k]->out_width()}, dt);
        }
      scratch_rows_ = rows;
    }
  }
  if (!is_last_) sl.acts[L] = bd.out;
  if (!is_first_) sl.grads[0] = bd.in_grad;
  return sl;
}

BlockSaved& ModelChunk::saved(Slot& sl, size_t k) { return recomputed_[k] ? scratch_[scratch_of_[k]] : sl.saved[k]; }

void ModelChunk::set_documents(int mb, int64_t rows, const int32_t* doc_start, const int32_t* positions,
                               const int32_t* q_pos) {
  Slot& sl = slot(mb, rows);
  auto put = [&](Tensor& t, const int32_t* host) {
    if (!host) return void(t = Tensor());
    if (!t.defined() || t.numel() < sl.capacity) {
      MemoryScope scope(MemKind::activations);
      t = Tensor(be_, {sl.capacity}, DType::i32);
    }
    Tensor part = t.rows(0, rows);
    be_.upload(part, host);
  };
  put(sl.doc_start, doc_start);
  put(sl.positions, positions);
  put(sl.q_pos, q_pos);
  documents_ = true;
}

void ModelChunk::hand_documents(Slot& sl, size_t k, int64_t rows) {
  if (!documents_) return;
  auto part = [&](const Tensor& t) { return t.defined() ? t.rows(0, rows) : Tensor(); };
  blocks_[k]->set_documents(part(sl.doc_start), part(sl.positions), part(sl.q_pos));
}

Tensor ModelChunk::act(Slot& sl, size_t k, int64_t rows) {
  return sl.acts[k].rows(0, k < blocks_.size() ? in_rows(k, rows) : out_rows(k - 1, rows));
}
Tensor ModelChunk::grad(Slot& sl, size_t k, int64_t rows) {
  return sl.grads[k].rows(0, k < blocks_.size() ? in_rows(k, rows) : out_rows(k - 1, rows));
}

Tensor ModelChunk::input(int mb, int64_t rows) { return act(slot(mb, rows), 0, rows); }
Tensor ModelChunk::output_grad(int mb, int64_t rows) { return grad(slot(mb, rows), blocks_.size(), rows); }

Tensor ModelChunk::forward_output(int mb, int64_t rows) { return act(slot(mb, rows), blocks_.size(), rows); }
Tensor ModelChunk::input_grad(int mb, int64_t rows) {
  RELAY_ASSERT(!is_first_, "the first chunk computes no input gradient");
  return grad(slot(mb, rows), 0, rows);
}

void ModelChunk::params_in(size_t k, int64_t next) {
  if (!hooks_ || blocks_[k]->params().empty()) return;
  hooks_->before_params(blocks_[k]->spec().index);
  if (next >= 0 && next < int64_t(blocks_.size())) hooks_->prefetch_params(blocks_[size_t(next)]->spec().index);
}
void ModelChunk::params_out(size_t k, bool forward) {
  if (!hooks_ || blocks_[k]->params().empty()) return;
  bool last = forward && is_last_;  // the forward's last block with parameters: its backward reads them first
  for (size_t j = k + 1; last && j < blocks_.size(); ++j) last = blocks_[j]->params().empty();
  hooks_->after_params(blocks_[k]->spec().index, last);
}

Tensor ModelChunk::forward(int mb, int64_t rows) {
  Slot& sl = slot(mb, rows);
  for (size_t k = 0; k < blocks_.size(); ++k) {
    Tensor y = act(sl, k + 1, rows);
    hand_documents(sl, k, rows);
    params_in(k, int64_t(k) + 1);
    blocks_[k]->forward(be_, act(sl, k, rows), y, saved(sl, k));
    params_out(k, true);
  }
  return act(sl, blocks_.size(), rows);
}

Tensor ModelChunk::backward_input(int mb, int64_t rows) {
  RELAY_ASSERT(split_backward_, "chunk " << id_ << " was built for B and W together (ModelChunk::backward)");
  Slot& sl = slot(mb, rows);
  for (size_t k = 0; k < blocks_.size(); ++k)
    RELAY_ASSERT(!recomputed_[k], "a recomputed block's backward runs B and W together (ModelChunk::backward)");
  for (size_t k = blocks_.size(); k-- > 0;) {
    if (!needs_input_grad(k)) break;
    Tensor dx = grad(sl, k, rows);
    hand_documents(sl, k, rows);
    params_in(k, int64_t(k) - 1);
    blocks_[k]->backward_input(be_, act(sl, k, rows), grad(sl, k + 1, rows), dx, sl.saved[k]);
    params_out(k);
  }
  return is_first_ ? Tensor() : grad(sl, 0, rows);
}

void ModelChunk::backward_weight(int mb, int64_t rows) {
  RELAY_ASSERT(split_backward_, "chunk " << id_ << " was built for B and W together (ModelChunk::backward)");
  Slot& sl = slot(mb, rows);
  for (size_t k = blocks_.size(); k-- > 0;)
    if (!blocks_[k]->params().empty()) {
      hand_documents(sl, k, rows);
      weight_grads(k, act(sl, k, rows), grad(sl, k + 1, rows), saved(sl, k));
    }
}

void ModelChunk::weight_grads(size_t k, const Tensor& x, const Tensor& dy, BlockSaved& sv) {
  const int index = blocks_[k]->spec().index;
  if (hooks_) hooks_->before_weight_grads(index);
  blocks_[k]->backward_weight(be_, x, dy, sv);
  if (hooks_) hooks_->after_weight_grads(index);
}

Tensor ModelChunk::backward(int mb, int64_t rows) {
  Slot& sl = slot(mb, rows);
  for (size_t k = blocks_.size(); k-- > 0;) {
    Tensor x = act(sl, k, rows), dy = grad(sl, k + 1, rows);
    BlockSaved& sv = saved(sl, k);
    hand_documents(sl, k, rows);
    params_in(k, int64_t(k) - 1);
    if (recomputed_[k]) {  // the forward again, from the kept input; its output (already used) is dropped
      Tensor y = scratch_out_.rows(0, out_rows(k, rows));
      blocks_[k]->forward(be_, x, y, sv);
    }
    // Input gradient first: a block's backward_input may leave intermediates its backward_weight reads.
    if (needs_input_grad(k) && blocks_[k]->weights_in_backward()) {  // W's GEMMs hide B's collectives
      const int index = blocks_[k]->spec().index;
      if (hooks_) hooks_->before_weight_grads(index);
      Tensor dx = grad(sl, k, rows);
      blocks_[k]->backward(be_, x, dy, dx, sv);
      if (hooks_) hooks_->after_weight_grads(index);
      params_out(k);
      continue;
    }
    if (needs_input_grad(k)) {
      Tensor dx = grad(sl, k, rows);
      blocks_[k]->backward_input(be_, x, dy, dx, sv);
    }
    if (!blocks_[k]->params().empty()) weight_grads(k, x, dy, sv);
    params_out(k);
  }
  return is_first_ ? Tensor() : grad(sl, 0, rows);
}

}  // namespace relay
