// Everything one rank's training run holds, built by setup.cpp in phases and used by the step loop
// (trainer.cpp) and evaluation (evaluation.cpp).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "io/dataset.hpp"
#include "io/prefetcher.hpp"
#include "io/token_dataset.hpp"
#include "model/chunk.hpp"
#include "model/loss.hpp"
#include "model/param.hpp"
#include "optim/optimizer.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/executor.hpp"
#include "parallel/process_grid.hpp"
#include "comm/trace.hpp"
#include "train/model_layout.hpp"

namespace relay {

// The training or evaluation set: an MLP feature file or a GPT token file.
struct DataSource {
  std::optional<Hdf5Dataset> features;  // MLP
  std::optional<TokenDataset> tokens;   // GPT
  bool defined() const { return features || tokens; }
  int64_t samples() const { return tokens ? tokens->sequences() : features->samples(); }
};

struct Run {
  const Config& cfg;
  ProcessGrid grid;
  std::unique_ptr<Backend> be;
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> dp_comm, pp_comm, tp_comm, cp_comm;
  TensorParallel tp;  // this stage's tensor-parallel group (size 1: none)
  // parallel.overlap: a duplicate of the tp group for the collectives that overlap compute (TensorParallel::async_comm)
  std::unique_ptr<Communicator> tp_async_comm;
  MPI_Comm tp_async_mpi = MPI_COMM_NULL;
  ContextParallel cp;  // this rank's context-parallel group (size 1: none)
  // parallel.ep: this rank's expert-parallel group and the ranks holding the same experts (null when alone)
  std::unique_ptr<Communicator> ep_comm, expert_dp_comm;
  ExpertParallel ep;
  std::unique_ptr<Communicator> tied_comm;  // first and last pipeline rank of a replica, when they share a weight
  MPI_Comm tied_mpi = MPI_COMM_NULL;
  DataSource train_data, eval_data;
  DocumentLayout documents;  // data.document_mask (off: eot < 0)
  ModelLayout layout;
  std::unique_ptr<ParamStore> store;
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  std::map<int, ModelChunk*> chunk_map;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<GradBuckets> buckets;
  std::unique_ptr<Optimizer> optimizer;
  std::map<std::string, Param*> params;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Prefetcher> prefetcher;
  std::string preload_note;  // data.preload: the log line saying the training inputs are on the device
  std::unique_ptr<Tracer> tracer;  // [trace] steps; null when off
  ScheduleShape shape{};
  int64_t mb_rows = 0, replica_rows = 0, start_step = 0;
  double predicted_bubble = 0;
  // optimizer.zero >= 3 over more than one replica: parameters sharded, each block's gathered over the replicas when
  // it runs (so every replica must run as many forwards).
  bool zero3 = false;
  bool verify_tied = false;  // RELAY_VERIFY_TIED=1: check the tied copies are bitwise equal every step
  int64_t nonfinite_in_a_row = 0;  // consecutive steps skipped for a non-finite loss or gradient norm
  // moe.expert_bias: every MoE layer's bias, (MoE layers, n_experts), the same on every rank (each computes every
  // layer's update from the world's token counts); checkpointed as router/expert_bias. Empty without it.
  std::vector<float> expert_bias;

  explicit Run(const Config& c) : cfg(c) {}
};

// Setup phases (setup.cpp); each throws relay::Error for user mistakes, run under agree_on_errors.
void setup_grid_and_backend(Run& r);
void setup_communicators(Run& r);
void setup_data_and_model(Run& r);
void teardown(Run& r);

struct EvalResult {
  double loss = 0, accuracy = 0;
};
// Mean loss and accuracy (next-token accuracy for GPT) over the whole eval set; collective.
EvalResult evaluate(Run& r);

}  // namespace relay
