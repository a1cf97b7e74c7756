// Relay's HDF5 checkpoint format, version 1 (io/README.md "Checkpoint format"): whole global tensors named
// as PyTorch's state_dict and torch.optim's state, so a file never depends on the parallel layout.
// Written under a temporary name, fsynced and renamed into place; `latest` is replaced the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace relay {

constexpr int kCheckpointVersion = 1;
constexpr const char* kCheckpointFormat = "relay-checkpoint";

struct CheckpointMeta {
  int64_t step = 0;                // optimizer steps done
  std::string config_toml;         // the effective config of the run that wrote it
  int64_t dp = 1, pp = 1, virtual_stages = 1;
  int64_t tp = 1, zero = 0;  // the writer's tensor parallelism and ZeRO-1 (for the record; files before them: 1, 0)
  std::string schedule;
  std::string optimizer;           // "adamw" | "sgd"
  int64_t optimizer_step = 0;
  // data sampler: step s (1-based) reads positions (s-1)*batch_size ... of the sample stream
  int64_t batch_size = 0, samples = 0, epoch = 0, position = 0;
  bool shuffle = false;
  uint64_t data_seed = 0, model_seed = 0;
  std::string tokenizer;           // GPT: the training data's tokenizer ("bytes" | "gpt2" | "hf"); "" for the MLP
};

struct CheckpointTensor {
  std::string name;  // "model/0.weight", "optimizer/exp_avg/0.weight"
  Shape shape;
  std::vector<float> data;      // shape's values, unless view is set
  const float* view = nullptr;  // shape's values held elsewhere (a training run's host copy of its checkpoint)
  // Or produced as the tensor is written (a streamed checkpoint: rank 0 receives it then): called once, just
  // before the write, outside the HDF5 lock; the pointer stays valid until the write is done.
  std::function<const float*()> fetch;
  const float* values() const { return view ? view : data.data(); }
};

// Writes `path` atomically: <path>.tmp-<pid>, flush, fsync, rename, fsync of the directory.
// If the environment variable RELAY_FAULT_CRASH_BEFORE_RENAME equals meta.step, the process exits
// (status 86) after the temporary file is complete and before the rename: the crash-safety test hook.
// On any failure (disk full, permission denied, quota) the temporary file is removed, the error names
// the file, the tensor and the OS's reason, and `path` is untouched. on_tensor (may be empty) is called
// after each tensor is written (the progress watchdog's poll point).
// Thread safety: every HDF5 call holds Hdf5Lock, released between tensors, so a background writer
// (checkpoint.async) and the training thread's dataset reads take turns instead of waiting for the file.
void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                           const std::vector<CheckpointTensor>& tensors,
                           const std::function<void()>& on_tensor = {});

class CheckpointReader {
 public:
  // Opens and checks: an HDF5 file, format "relay-checkpoint", version <= 1, marked complete.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  const CheckpointMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  // Every tensor (name, shape) in the file, sorted by name.
  std::vector<std::pair<std::string, Shape>> tensors() const;
  bool has(const std::string& name) const;
  // Reads one tensor; an Error names the tensor and both shapes when `expected` differs.
  void read(const std::string& name, const Shape& expected, float* out) const;

 private:
  std::string path_;
  long file_ = -1;  // hid_t
  CheckpointMeta meta_;
};

// <dir>/latest holds the file name of the newest complete checkpoint; replaced atomically.
void write_latest(const std::string& dir, const std::string& file_name);
std::string read_latest(const std::string& dir);  // "" when there is none
std::string checkpoint_file_name(int64_t step);    // "step_%08d.h5"
// Removes temporary files a dead writer left in dir ("step_*.h5.tmp-PID", "latest.tmp-PID"): only one
// job writes to a checkpoint directory, so at its start any such file is debris. Returns their names.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);
// Deletes all but the newest `keep` complete step_*.h5 files in dir (keep >= 1); returns what it deleted.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep);

}  // namespace relay
