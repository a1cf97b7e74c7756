// Moving checkpoints between the ranks and the file: world rank 0 writes one file of whole tensors,
// whatever the layout. A tensor's owning stage sends it from replica 0, one shard per tp rank when
// tensor parallelism splits it; ZeRO-1 optimizer state is first gathered within the replica group
// (each replica holds a piece). On resume every rank reads the tensors of its own chunks and keeps its
// shard and piece of each.
#pragma once
#include <map>
#include <string>

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
  std::map<std::string, Param*> params;  // this rank's parameters by name
  Optimizer& optimizer;
  int64_t samples = 0;  // training set size (sampler position)
  std::string tokenizer;  // a GPT model's data tokenizer ("bytes" | "gpt2"), stored for `relay generate`
};

// Every tensor a checkpoint of this model and optimizer holds, with its owning pipeline rank.
struct ManifestEntry {
  std::string name;  // "model/0.weight", "optimizer/exp_avg/0.weight"
  Shape shape;       // the whole tensor (what the file holds)
  TpSplit split;     // how tensor parallelism splits it among a stage's tp ranks
  std::vector<int> pp_ranks;  // holders; the first (the owner) sends it to rank 0 when saving
  int owner() const { return pp_ranks.front(); }
  bool held_by(int pp_rank) const {
    for (int r : pp_ranks) if (r == pp_rank) return true;
    return false;
  }
};
std::vector<ManifestEntry> checkpoint_manifest(const ModelLayout& layout, const Config::Optimizer& opt);

// Collective over MPI_COMM_WORLD. Returns the file's path (on every rank) after rank 0 has written it,
// updated `latest` and pruned old files; rank 0 logs its size and time.
std::string save_checkpoint(CheckpointContext& ctx, int64_t step);

// model.init_from: this rank's parameters from a safetensors file named as the PyTorch module's
// state_dict (relay ckpt export writes one; so does safetensors.torch.save_file(model.state_dict())).
// Every rank checks the whole model against the file first (missing tensors, shapes, tensors the model
// does not have), so every rank reports the same mismatch. Optimizer state starts at zero.
void load_init_from(CheckpointContext& ctx, const std::string& path);

// Which file checkpoint.resume names ("none" -> "", "auto" -> latest or "", else the path).
std::string resolve_resume_path(const Config& cfg);
// Loads this rank's tensors and the optimizer step; checks every tensor of the model against the
// file first (names and shapes) and the optimizer name. Returns the step the file holds.
int64_t load_checkpoint(CheckpointContext& ctx, const std::string& path);

}  // namespace relay
