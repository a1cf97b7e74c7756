// The executor: a plain interpreter of one rank's schedule (schedule.hpp), validated beforehand by
// the simulator. It runs forwards and backwards on the rank's model chunks, moves activations and
// gradients between stages with non-blocking point-to-point, starts a chunk's gradient-bucket
// all-reduces at its allreduce_grads action and sums a tied weight's two copies at reduce_tied_grads.
#pragma once
#include <map>
#include <vector>

#include "comm/communicator.hpp"
#include "model/chunk.hpp"
#include "model/context_parallel.hpp"
#include "model/documents.hpp"
#include "model/loss.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/process_grid.hpp"
#include "parallel/schedule.hpp"
#include "comm/trace.hpp"

namespace relay {

// A replica's slice of one global batch on the host, samples [i*mb_rows, (i+1)*mb_rows) forming
// micro-batch i. First stage: inputs (samples, D) for the MLP or tokens (samples, T) for GPT. Last
// stage: class_targets (samples x T) (T = 1 for the MLP) or dense_targets (samples, K).
struct StepData {
  const float* inputs = nullptr;
  const int32_t* tokens = nullptr;
  const int32_t* class_targets = nullptr;
  const float* dense_targets = nullptr;
  // data.preload: the samples' rows (samples) of the inputs held on the device (Executor::preload_inputs), given
  // instead of `inputs`.
  const int32_t* rows = nullptr;
  // data.document_mask: the targets the loss counts over the whole global batch (every replica); the mean's
  // denominator, and 1 / it the gradients' scale. 0: every row counts (batch x T).
  int64_t counted_targets = 0;
  // Multi-token prediction (model.num_mtp_layers = D > 0): per module k, the positions CE_k counts over the whole
  // global batch (model/documents.hpp, counted_mtp_targets), its mean's denominator. Empty without MTP.
  std::vector<int64_t> mtp_counted;
};

struct StepStats {
  double loss_sum = 0;     // sum of per-row losses (samples, or tokens for GPT) of this rank's micro-batches
                           // (last stage only)
  double compute_s = 0;    // time in forward/backward actions
  double wait_s = 0;       // time blocked in receives and the final waits: the measured bubble
  double pipeline_wait_s = 0;   // of which in receives of activations and gradients
  double allreduce_wait_s = 0;  // of which in the all-reduces at the end of the step
  // Exposed communication (issue 40): the time this rank's thread waited on its data-parallel collectives (gradient
  // all-reduces and reduce-scatters, ZeRO's parameter all-gathers) wherever in the step, the part the overlap did not
  // hide (GradBuckets::take_waited_s; filled by the step loop, after the ZeRO all-gather).
  double exposed_comm_s = 0;
  double step_s = 0;
  std::vector<RouterStats> routers;  // this rank's MoE layers' router statistics of the step
  std::vector<double> mtp;  // multi-token prediction: per module, the sum of its CE over this rank's rows (last stage)
};

class Executor {
 public:
  // chunks: this rank's chunks by global chunk id. loss: non-null on the rank holding the last chunk.
  // seq_len: activation rows per sample (T for GPT, 1 for the MLP). tied: this rank's copies of weights
  // held by two pipeline ranks, summed over tied_comm (the pair) at reduce_tied_grads.
  Executor(Backend& be, const ProcessGrid& grid, Communicator& pp_comm, std::map<int, ModelChunk*> chunks,
           Loss* loss, GradBuckets& buckets, const ScheduleShape& shape, std::vector<Action> actions,
           int64_t mb_rows, int64_t seq_len, int64_t global_batch, Communicator* tied_comm = nullptr,
           std::vector<Param*> tied = {}, DocumentLayout documents = {}, ContextParallel cp = {});
  // Runs every action up to and including optimizer_step's synchronisation point: afterwards the
  // gradients are averaged over data-parallel replicas and ready for clipping and the update.
  StepStats run_step(const StepData& data);
  // Record the next run_step's spans in tracer as step `step` (null: do not trace).
  void set_trace(Tracer* tracer, int64_t step) {
    tracer_ = tracer;
    trace_step_ = step;
  }
  // Forward only over `samples` samples (eval); returns on the last stage the loss sum and correct
  // count over their rows (samples x seq_len), of which `counted` count (all but a document mask's ignored ones).
  void evaluate(int64_t samples, const StepData& data, double& loss_sum, int64_t& correct, int64_t& counted);
  // data.preload: every training input (samples, D), in the first chunk's input dtype, held on the device; steps
  // whose StepData names rows gather their micro-batches from it.
  void preload_inputs(Tensor all);
  bool preloaded() const { return preloaded_.defined(); }  // the prefetcher then hands over rows, not inputs

 private:
  int peer_of_chunk(int chunk) const { return chunk % shape_.pp; }  // pp_comm rank
  int tag(int kind, int chunk, int mb) const;
  ModelChunk& chunk(int c);
  void upload_input(ModelChunk& ch, int slot, int64_t sample0, int64_t samples, const StepData& d);
  void upload_targets(int slot, int64_t sample0, int64_t samples, const StepData& d);
  // The sequence layout of `samples` samples of d's tokens (this rank's rows) into the host buffers below: the
  // document mask's starts and positions, and under context parallelism every row's place in its sequence.
  void lay_out_documents(int64_t samples, const StepData& d);
  // Micro-batch mb's whole sequences as the multi-token prediction block reads them (after lay_out_documents).
  MtpBatch mtp_batch(int mb, const StepData& d);
  bool has_layout() const { return docs_.on() || cp_.on(); }
  // This rank's rows of `samples` samples of a (samples, T) host array: all of them, or under context parallelism
  // each sequence's chunks rank and 2cp - 1 - rank (model/context_parallel.hpp), into local_.
  const int32_t* local_rows(const int32_t* full, int64_t samples);
  void reduce_tied();
  void trace(const Action& a, int64_t begin_mark, bool compute);
  void wait_all_sends();

  Backend& be_;
  const ProcessGrid& grid_;
  Communicator& comm_;
  std::map<int, ModelChunk*> chunks_;
  Loss* loss_;
  GradBuckets& buckets_;
  ScheduleShape shape_;
  std::vector<Action> actions_;
  int64_t mb_rows_;   // samples per micro-batch
  int64_t seq_len_;   // rows per sample (T for a language model, 1 for the MLP)
  ContextParallel cp_;
  int64_t local_len_;  // this rank's rows per sample: seq_len_ / cp
  int64_t rows_;      // activation rows per micro-batch: mb_rows_ x local_len_
  float grad_scale_;
  int last_chunk_;
  Communicator* tied_comm_;
  std::vector<Param*> tied_;
  std::vector<RequestPtr> sends_;
  Tracer* tracer_ = nullptr;
  int64_t trace_step_ = 0;
  double slow_s_ = 0;  // test only: RELAY_TEST_SLOW_RANK / RELAY_TEST_SLOW_MS, slept in every forward
  DocumentLayout docs_;                          // data.document_mask (off: eot < 0)
  std::vector<int32_t> doc_start_, positions_, q_pos_;  // (samples x T / cp) of the step or evaluation batch
  std::vector<int32_t> masked_targets_;          // (micro-batch rows) targets with the ignored ones -1
  std::vector<int32_t> all_doc_start_;           // (samples x T) the step's document starts, every position
  std::vector<int32_t> mtp_targets_;             // (micro-batch rows) the MTP block's targets (mtp_batch)
  std::vector<int32_t> local_, local2_;          // local_rows' results
  Tensor preloaded_;                             // (samples in the file, D) data.preload's inputs, or undefined
  Tensor preload_rows_;                          // (mb_rows) i32: a micro-batch's rows of preloaded_
};

}  // namespace relay
