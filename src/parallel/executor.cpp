#include "parallel/executor.hpp"

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/watchdog.hpp"
#include "parallel/slot_plan.hpp"

namespace relay {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
enum MsgKind { kActivation = 0, kGrad = 1 };
// Next-token targets of a language model on the host (multi-token prediction reads them whole, under cp too).
bool d_has_targets(const StepData& d) { return d.class_targets != nullptr && d.dense_targets == nullptr; }
// The chunk holds DeepSeek-V3's multi-token prediction block (model/mtp_block.cpp), which reads the targets.
bool has_mtp(const ModelChunk& ch) {
  for (const auto& b : ch.blocks())
    if (b->spec().kind == BlockKind::mtp) return true;
  return false;
}

// Test only: RELAY_TEST_SLOW_RANK=R RELAY_TEST_SLOW_MS=M make world rank R sleep M ms in every
// forward, a straggler on purpose (tests/faults/test_straggler.sh); 0 elsewhere.
double test_slow_seconds(int world_rank) {
  const char* rank = std::getenv("RELAY_TEST_SLOW_RANK");
  const char* ms = std::getenv("RELAY_TEST_SLOW_MS");
  if (!rank || !ms || std::atoi(rank) != world_rank) return 0;
  return std::atof(ms) / 1000.0;
}
}  // namespace

Executor::Executor(Backend& be, const ProcessGrid& grid, Communicator& pp_comm, std::map<int, ModelChunk*> chunks,
                   Loss* loss, GradBuckets& buckets, const ScheduleShape& shape, std::vector<Action> actions,
                   int64_t mb_rows, int64_t seq_len, int64_t global_batch, Communicator* tied_comm,
                   std::vector<Param*> tied, DocumentLayout documents, ContextParallel cp)
    : be_(be), grid_(grid), comm_(pp_comm), chunks_(std::move(chunks)), loss_(loss), buckets_(buckets),
      shape_(shape), actions_(std::move(actions)), mb_rows_(mb_rows), seq_len_(seq_len), cp_(cp),
      local_len_(seq_len / cp.size), rows_(mb_rows * local_len_),
      // The loss is the mean over every row (target token) of the global batch.
      grad_scale_(1.f / static_cast<float>(global_batch * seq_len)), last_chunk_(num_chunks(shape) - 1),
      tied_comm_(tied_comm), tied_(std::move(tied)), slow_s_(test_slow_seconds(grid.world_rank)), docs_(documents) {
  RELAY_ASSERT(local_len_ * cp.size == seq_len, "context parallelism: sequences of " << seq_len << " over " << cp.size
                                                                                     << " ranks");
  // Micro-batches share activation slots as the schedule allows (1F1B: pp - rank of them).
  SlotPlan plan = plan_slots(actions_, shape_.m);
  for (auto& [c, ch] : chunks_) ch->set_slot_plan(plan.slot_of[c]);
}

int Executor::tag(int kind, int chunk, int mb) const {
  // Unique per (kind, chunk, micro-batch) within a step; MPI guarantees at least 32767 tags.
  return ((mb * num_chunks(shape_) + chunk) * 2 + kind) % 32768;
}

ModelChunk& Executor::chunk(int c) {
  auto it = chunks_.find(c);
  RELAY_ASSERT(it != chunks_.end(), "chunk " << c << " is not on pp rank " << grid_.pp_rank);
  return *it->second;
}

const int32_t* Executor::local_rows(const int32_t* full, int64_t samples) {
  if (!cp_.on()) return full;
  local_.resize(static_cast<size_t>(samples * local_len_));
  for (int64_t s = 0; s < samples; ++s)
    for (int64_t j = 0; j < local_len_; ++j)
      local_[static_cast<size_t>(s * local_len_ + j)] = full[s * seq_len_ + cp_position(seq_len_, cp_.size, cp_.rank, j)];
  return local_.data();
}

void Executor::preload_inputs(Tensor all) {
  preloaded_ = std::move(all);
  preload_rows_ = Tensor(be_, {mb_rows_}, DType::i32);
}

void Executor::upload_input(ModelChunk& ch, int slot, int64_t sample0, int64_t samples, const StepData& d) {
  Tensor in = ch.input(slot, samples * local_len_);
  if (ch.in_width() == 0) {
    be_.upload(in, local_rows(d.tokens + sample0 * seq_len_, samples));  // (samples x T/cp) ids
  } else if (d.rows) {  // data.preload: gathered on the device
    RELAY_ASSERT(preloaded_.defined() && samples <= preload_rows_.numel(), "preloaded inputs: none, or too few rows");
    Tensor rows = preload_rows_.rows(0, samples);                     // (samples) i32
    be_.upload(rows, d.rows + sample0);
    be_.gather_rows(preloaded_, rows, in);                           // (samples, D)
  } else {
    be_.upload_f32(in, d.inputs + sample0 * ch.in_width());          // (samples, D)
  }
}

void Executor::upload_targets(int slot, int64_t sample0, int64_t samples, const StepData& d) {
  Tensor t = loss_->targets(slot, samples * local_len_);
  if (loss_->kind() == LossKind::cross_entropy && (docs_.on() || cp_.on())) {
    const int64_t n = samples * seq_len_;  // whole sequences: masked, then this rank's rows
    masked_targets_.assign(d.class_targets + sample0 * seq_len_, d.class_targets + sample0 * seq_len_ + n);
    if (docs_.on())  // the next document's first tokens are ignored
      mask_document_targets(docs_, d.tokens + sample0 * seq_len_, n, masked_targets_.data());
    be_.upload(t, local_rows(masked_targets_.data(), samples));
  } else if (loss_->kind() == LossKind::cross_entropy) {
    be_.upload(t, d.class_targets + sample0 * seq_len_);
  } else {
    be_.upload_f32(t, d.dense_targets + sample0 * t.size(1));
  }
}

void Executor::lay_out_documents(int64_t samples, const StepData& d) {
  RELAY_ASSERT(d.tokens, "the sequence layout: this rank read no input tokens");
  const int64_t n = samples * seq_len_, local = samples * local_len_;
  std::vector<int32_t> ds(static_cast<size_t>(n)), pos(static_cast<size_t>(n)), place(static_cast<size_t>(n));
  if (docs_.on()) document_layout(docs_, d.tokens, n, seq_len_, ds.data(), pos.data());
  for (int64_t r = 0; r < n; ++r) {
    place[static_cast<size_t>(r)] = int32_t(r % seq_len_);
    if (!docs_.on()) pos[static_cast<size_t>(r)] = int32_t(r % seq_len_);
  }
  auto keep = [&](const std::vector<int32_t>& full, std::vector<int32_t>& out) {
    const int32_t* l = local_rows(full.data(), samples);
    out.assign(l, l + local);
  };
  keep(ds, doc_start_);
  keep(pos, positions_);
  keep(place, q_pos_);
  if (docs_.on()) all_doc_start_ = std::move(ds);
}

MtpBatch Executor::mtp_batch(int mb, const StepData& d) {
  const int64_t n = mb_rows_ * seq_len_, first = mb * n;  // the micro-batch's whole sequences
  MtpBatch b;
  b.targets = d.class_targets + first;
  b.counted = d.mtp_counted.empty() ? nullptr : d.mtp_counted.data();
  if (docs_.on()) {  // the main loss's targets (-1 at the end-of-text inputs) and the document starts
    mtp_targets_.assign(d.class_targets + first, d.class_targets + first + n);
    mask_document_targets(docs_, d.tokens + first, n, mtp_targets_.data());
    RELAY_ASSERT(int64_t(all_doc_start_.size()) >= first + n, "the multi-token prediction's document layout: none");
    b.targets = mtp_targets_.data();
    b.doc_start = all_doc_start_.data() + first;
  }
  return b;
}

void Executor::wait_all_sends() {
  for (auto& r : sends_) r->wait();
  sends_.clear();
}

void Executor::reduce_tied() {
  // The data-parallel sums first (this pair's ranks hold replica sums of their own copy), then the
  // pair's sum: a + b on one rank and b + a on the other are the same float, so the copies stay equal.
  buckets_.finish();
  for (Param* p : tied_) {
    Tensor g = buckets_.reduced_grad(p);  // (ZeRO: this replica's piece, the same piece on both stages)
    RequestPtr r = tied_comm_->iallreduce_sum(g);
    r->what = cat("the tied-weight reduction of ", p->name);
    r->wait();
  }
}

StepStats Executor::run_step(const StepData& data) {
  StepStats st;
  const double t_step = now_s();
  // The loss is the mean over the counted targets of the global batch (with a document mask, all but the
  // positions before a document's first token; the same count on every rank).
  const float grad_scale = data.counted_targets > 0 ? 1.f / static_cast<float>(data.counted_targets) : grad_scale_;
  if (has_layout()) lay_out_documents(shape_.m * mb_rows_, data);
  buckets_.zero();
  buckets_.set_trace(tracer_, trace_step_);
  if (cp_.attention) cp_.attention->set_trace(tracer_, trace_step_);
  for (const Action& a : actions_) {
    const int c = a.chunk, mb = a.micro_batch;
    const double t0 = now_s();
    const int64_t m0 = tracer_ ? tracer_->mark() : 0;
    bool compute = false;
    switch (a.op) {
      case Op::forward: {
        ModelChunk& ch = chunk(c);
        if (has_layout())
          ch.set_documents(mb, rows_, docs_.on() ? doc_start_.data() + mb * rows_ : nullptr,
                           positions_.data() + mb * rows_, cp_.on() ? q_pos_.data() + mb * rows_ : nullptr);
        if (c == 0) {
          upload_input(ch, mb, mb * mb_rows_, mb_rows_, data);
        } else if (chunks_.count(c - 1)) {  // previous chunk on this rank (pp == 1)
          Tensor in = ch.input(mb, rows_);
          be_.copy(in, chunk(c - 1).forward_output(mb, rows_));
        }
        if (c == last_chunk_ && d_has_targets(data) && has_mtp(ch)) {  // the MTP block reads them in its forward
          const MtpBatch batch = mtp_batch(mb, data);
          for (const auto& b : ch.blocks()) b->set_targets(batch);
        }
        Tensor out = ch.forward(mb, rows_);
        if (slow_s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow_s_));
        if (c == last_chunk_) {
          upload_targets(mb, mb * mb_rows_, mb_rows_, data);
          Tensor dout = ch.output_grad(mb, rows_);
          st.loss_sum += loss_->forward_backward(mb, out, dout, grad_scale);
        }
        compute = true;
        break;
      }
      case Op::backward:
      case Op::backward_input: {
        ModelChunk& ch = chunk(c);
        if (c < last_chunk_ && chunks_.count(c + 1)) {  // next chunk on this rank (pp == 1)
          Tensor g = ch.output_grad(mb, rows_);
          be_.copy(g, chunk(c + 1).input_grad(mb, rows_));
        }
        if (a.op == Op::backward) ch.backward(mb, rows_);
        else ch.backward_input(mb, rows_);
        compute = true;
        break;
      }
      case Op::backward_weight:
        chunk(c).backward_weight(mb, rows_);
        compute = true;
        break;
      case Op::send_activation:
        sends_.push_back(comm_.isend(chunk(c).forward_output(mb, rows_), peer_of_chunk(c + 1), tag(kActivation, c + 1, mb)));
        sends_.back()->what = cat("the delivery of its activation of micro-batch ", mb, " (chunk ", c, ")");
        break;
      case Op::recv_activation: {
        Tensor in = chunk(c).input(mb, rows_);
        RequestPtr r = comm_.irecv(in, peer_of_chunk(c - 1), tag(kActivation, c, mb));
        r->what = cat("its activation of micro-batch ", mb, " (chunk ", c, ")");
        r->wait();
        st.wait_s += now_s() - t0;
        st.pipeline_wait_s += now_s() - t0;
        break;
      }
      case Op::send_grad:
        sends_.push_back(comm_.isend(chunk(c).input_grad(mb, rows_), peer_of_chunk(c - 1), tag(kGrad, c - 1, mb)));
        sends_.back()->what = cat("the delivery of its gradient of micro-batch ", mb, " (chunk ", c, ")");
        break;
      case Op::recv_grad: {
        Tensor g = chunk(c).output_grad(mb, rows_);
        RequestPtr r = comm_.irecv(g, peer_of_chunk(c + 1), tag(kGrad, c, mb));
        r->what = cat("its gradient of micro-batch ", mb, " (chunk ", c, ")");
        r->wait();
        st.wait_s += now_s() - t0;
        st.pipeline_wait_s += now_s() - t0;
        break;
      }
      case Op::allreduce_grads:
        buckets_.launch_chunk(c);
        break;
      case Op::reduce_tied_grads:
        reduce_tied();
        st.wait_s += now_s() - t0;
        st.allreduce_wait_s += now_s() - t0;
        break;
      case Op::optimizer_step: {
        buckets_.finish();
        st.allreduce_wait_s += now_s() - t0;
        wait_all_sends();
        st.wait_s += now_s() - t0;
        break;
      }
    }
    if (compute) {
      st.compute_s += now_s() - t0;
      buckets_.progress();
    }
    if (tracer_) trace(a, m0, compute);
    watchdog_progress();  // an action done: answer the watchdog's questions
  }
  for (auto& [c, ch] : chunks_)
    for (const auto& b : ch->blocks()) b->take_router_stats(st.routers), b->take_mtp_stats(st.mtp);
  st.step_s = now_s() - t_step;
  return st;
}

void Executor::trace(const Action& a, int64_t m0, bool compute) {
  TraceSpan s;
  s.op = op_name(a.op);
  s.step = trace_step_;
  s.micro_batch = a.micro_batch;
  s.chunk = a.chunk;
  s.begin = m0;
  if (compute) {
    s.name = compute_span_name(op_name(a.op), a.micro_batch, a.chunk, shape_.v > 1);
  } else if (a.op == Op::recv_activation || a.op == Op::recv_grad) {
    s.track = kTrackComm;
    s.name = cat(a.op == Op::recv_activation ? "recv act " : "recv grad ", a.micro_batch);
  } else if (a.op == Op::optimizer_step || a.op == Op::reduce_tied_grads) {
    s.track = kTrackComm;  // the end-of-step wait for the all-reduces (and the tied-weight sum)
    s.op = a.op == Op::optimizer_step ? "allreduce_grads" : "reduce_tied_grads";
    s.name = a.op == Op::optimizer_step ? "allreduce" : "tied sum";
  } else {
    return;  // sends and all-reduce launches do not block
  }
  s.end = tracer_->mark();
  tracer_->add(std::move(s));
}

void Executor::evaluate(int64_t samples, const StepData& data, double& loss_sum, int64_t& correct,
                        int64_t& counted) {
  // One forward pass through every chunk in order, as micro-batch m (its own message tags) in micro-batch 0's buffers:
  // between steps none is in flight (ModelChunk::slot), and the loss's buffers of micro-batch 0 are free too.
  const int slot = shape_.m;
  const int64_t rows = samples * local_len_;
  loss_sum = 0;
  correct = 0;
  counted = rows;
  if (docs_.on() && data.tokens) {  // this rank's rows whose input is not the end-of-text token
    const int32_t* t = local_rows(data.tokens, samples);
    counted = counted_targets(docs_, t, rows);
  }
  if (has_layout()) lay_out_documents(samples, data);
  for (auto& [c, ch] : chunks_) {
    if (has_layout())
      ch->set_documents(slot, rows, docs_.on() ? doc_start_.data() : nullptr, positions_.data(),
                        cp_.on() ? q_pos_.data() : nullptr);
    if (c == 0) {
      upload_input(*ch, slot, 0, samples, data);
    } else {
      Tensor in = ch->input(slot, rows);
      if (chunks_.count(c - 1)) be_.copy(in, chunk(c - 1).forward_output(slot, rows));
      else {
        RequestPtr r = comm_.irecv(in, peer_of_chunk(c - 1), tag(kActivation, c, slot));
        r->what = cat("its evaluation activation (chunk ", c, ")");
        r->wait();
      }
    }
    for (const auto& b : ch->blocks()) b->set_targets(MtpBatch());  // evaluation: the main model's loss alone
    Tensor out = ch->forward(slot, rows);
    watchdog_progress();
    if (c == last_chunk_) {
      upload_targets(0, 0, samples, data);
      loss_->evaluate(0, out, loss_sum, correct);
    } else if (!chunks_.count(c + 1)) {
      sends_.push_back(comm_.isend(out, peer_of_chunk(c + 1), tag(kActivation, c + 1, slot)));
    }
  }
  wait_all_sends();
}

}  // namespace relay
