// Moving checkpoints between the ranks and the file: world rank 0 writes one file of whole tensors,
// whatever the layout. A tensor's owning stage sends it from replica 0, one shard per tp rank when
// tensor parallelism splits it; ZeRO-1 optimizer state is first gathered within the replica group
// (each replica holds a piece). Under expert parallelism an expert's tensors come from the first rank holding
// that expert (replica ep_owner), its ZeRO-1 pieces gathered over the ranks holding it. On resume every rank reads the tensors of its own chunks and keeps its
// shard and piece of each.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "io/checkpoint.hpp"
#include "model/param.hpp"
#include "optim/optimizer.hpp"
#include "parallel/process_grid.hpp"
#include "train/model_layout.hpp"

namespace relay {

struct CheckpointContext {
  const Config& cfg;
  const ProcessGrid& grid;
  const ModelLayout& layout;
  Backend& be;
  Communicator& world;  // every rank (host transfers to rank 0)
  Communicator& dp;     // this rank's replica group (ZeRO-1 pieces)
  std::map<std::string, Param*> params;  // this rank's parameters by name
  Optimizer& optimizer;
  int64_t samples = 0;  // training set size (sampler position)
  std::string tokenizer;  // a GPT model's data tokenizer ("bytes" | "gpt2" | "hf"), stored for `relay generate`
  // ZeRO-3: this rank's pieces of the parameters (GradBuckets::optimizer_slices), which hold them; empty otherwise.
  std::vector<OptimSlice> param_pieces = {};
  // moe.expert_bias: the run's bias, (MoE layers, n_experts) on every rank; saved as router/expert_bias (rank 0 holds
  // it whole) and read back by every rank. Null without it.
  std::vector<float>* expert_bias = nullptr;
  int64_t n_experts = 0;
  // parallel.ep: the ranks holding this rank's experts (their ZeRO-1 pieces); null when none other does.
  Communicator* expert_dp = nullptr;
};

// Every tensor a checkpoint of this model and optimizer holds, with its owning pipeline rank.
struct ManifestEntry {
  std::string name;  // "model/0.weight", "optimizer/exp_avg/0.weight"
  Shape shape;       // the whole tensor (what the file holds)
  TpSplit split;     // how tensor parallelism splits it among a stage's tp ranks
  std::vector<int> pp_ranks;  // holders; the first (the owner) sends it to rank 0 when saving
  int ep_owner = -1;          // an expert's weight or state under parallel.ep: the ep rank holding it (-1: every one)
  int owner() const { return pp_ranks.front(); }
  bool held_by(int pp_rank) const {
    for (int r : pp_ranks) if (r == pp_rank) return true;
    return false;
  }
};
std::vector<ManifestEntry> checkpoint_manifest(const ModelLayout& layout, const Config::Optimizer& opt);

// A checkpoint in rank 0's host memory, ready to be written (empty on other ranks but for path).
struct CheckpointImage {
  std::string dir, path;  // checkpoint.dir and the file's path
  int64_t keep = 0;       // checkpoint.keep
  CheckpointMeta meta;
  std::shared_ptr<std::byte> host;       // (checkpoint_bytes) every tensor's floats, manifest order
  std::vector<CheckpointTensor> tensors;  // views into host
  double started_s = 0, copied_s = 0;     // steady clock: gather began, copy into host ended
  bool background = false;                // written by checkpoint.async's writer thread
};

// Bytes of every tensor of a checkpoint (rank 0's host copy under checkpoint.async).
int64_t checkpoint_bytes(const ModelLayout& layout, const Config::Optimizer& opt);
// Bytes of its largest tensor (what rank 0 holds while it streams a synchronous checkpoint).
int64_t checkpoint_largest_tensor_bytes(const ModelLayout& layout, const Config::Optimizer& opt);
// Collective over every rank: each rank copies what it contributes into host memory and sends it to
// rank 0, which assembles the whole checkpoint in `host` (checkpoint_bytes; a fresh block when null).
CheckpointImage gather_checkpoint(CheckpointContext& ctx, int64_t step, std::shared_ptr<std::byte> host = {});
// Rank 0, any thread: the file (temporary, fsync, rename), `latest`, pruning and the log line.
// on_tensor runs after each tensor (the caller's progress hook). Throws Error on failure.
void write_checkpoint_image(const CheckpointImage& img, const std::function<void()>& on_tensor);

// Collective over every rank, streamed: rank 0 receives each tensor just before it writes it (one tensor in host
// memory at a time) while the others wait. Returns the
// file's path (on every rank) after rank 0 has written it, updated `latest` and pruned old files;
// rank 0 logs its size and time. A failed write ends every rank (agree_on_errors) with its message.
std::string save_checkpoint(CheckpointContext& ctx, int64_t step);

// model.init_from: this rank's parameters from a safetensors file named as the PyTorch module's
// state_dict (relay ckpt export writes one; so does safetensors.torch.save_file(model.state_dict())),
// or from a Hugging Face model directory (model/hf_model.hpp), whose config.json must match [model].
// Every rank checks the whole model against the file first (missing tensors, shapes, tensors the model
// does not have), so every rank reports the same mismatch. Optimizer state starts at zero.
void load_init_from(CheckpointContext& ctx, const std::string& path);

// Which file checkpoint.resume names ("none" -> "", "auto" -> latest or "", else the path).
std::string resolve_resume_path(const Config& cfg);
// Loads this rank's tensors and the optimizer step; checks every tensor of the model against the
// file first (names and shapes) and the optimizer name. Returns the step the file holds.
int64_t load_checkpoint(CheckpointContext& ctx, const std::string& path);

}  // namespace relay
