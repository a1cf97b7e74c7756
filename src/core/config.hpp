// The run configuration: a TOML file plus --set overrides, validated once into typed structs.
// Every key is a public interface (docs/configuration.md). Errors name the file and the key.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/precision.hpp"

namespace relay {

class ModelKeys;  // a model family's [model] keys (core/config_keys.hpp)

// A model family's own [model] keys, as its file in src/model/families declares them (LlamaArgs, MoeArgs, ...). core
// holds them without knowing them; the family reads them back with Config::Model::args<T>().
struct FamilyArgs {
  virtual ~FamilyArgs() = default;
  virtual std::unique_ptr<FamilyArgs> clone() const = 0;
};

struct Config {
  std::string source;  // the config file's path, for messages

  struct Run { std::string dir = "runs/relay"; } run;
  struct Model {
    std::string type = "mlp";            // a family's name (src/model/families; model/family.hpp's registry)
    // Initial weights: a .safetensors file (PyTorch names) or a Hugging Face model directory; "" = none
    std::string init_from;
    uint64_t seed = 1;
    std::string loss = "cross_entropy";  // cross_entropy | mse (mlp only)
    // The keys every language model has (model/family.hpp's parse_language_model_keys); the rest of [model] is the
    // family's own (args<T>()).
    int64_t vocab_size = 0, block_size = 0, n_layer = 0, n_head = 0, n_embd = 0;
    bool tie_embeddings = true;  // each family's default (gpt true, the Llama decoders false)
    double init_std = 0.02;

    // The family's own keys as its parse_keys read them (T: the family's struct, or one it derives from). A Config
    // made in code that holds none reads T's defaults; another family's keys are an Error naming model.type.
    template <class T>
    const T& args() const {
      if (!args_.p) {
        static const T defaults{};
        return defaults;
      }
      if (const T* a = dynamic_cast<const T*>(args_.p.get())) return *a;
      wrong_args();
    }
    // The same to fill in (the family's parse_keys, a Config made in code): a default T first when none are held.
    template <class T>
    T& edit_args() {
      if (!args_.p) args_.p = std::make_unique<T>();
      if (T* a = dynamic_cast<T*>(args_.p.get())) return *a;
      wrong_args();
    }

   private:
    // Copies clone the family's keys: a copied Config holds its own.
    struct Holder {
      std::unique_ptr<FamilyArgs> p;
      Holder() = default;
      Holder(const Holder& o) : p(o.p ? o.p->clone() : nullptr) {}
      Holder& operator=(const Holder& o) { p = o.p ? o.p->clone() : nullptr; return *this; }
      Holder(Holder&&) = default;
      Holder& operator=(Holder&&) = default;
    };
    [[noreturn]] void wrong_args() const;
    Holder args_;
  } model;
  struct Data {
    std::string train;
    std::string eval;  // optional
    bool shuffle = true;
    uint64_t seed = 2;
    // Language models: attention never crosses an end-of-text token (the token file's eot_id attribute), the
    // position whose target is the next document's first token is left out of the loss, and (reset_positions)
    // positions restart at 0 with every document.
    bool document_mask = false;
    bool reset_positions = true;
    // An MLP's training inputs held whole on the device, each micro-batch gathered there by its rows instead of read
    // from the file and uploaded: "on", "off", or "auto" (on with a CUDA device when they take at most a quarter
    // of its free memory).
    std::string preload = "auto";
  } data;
  struct Train {
    int64_t steps = 0;
    int64_t batch_size = 0;     // global batch per optimizer step
    int64_t micro_batches = 1;  // per data-parallel replica
    int64_t log_every = 10;
    int64_t eval_every = 0;     // 0 = only at the end
    double clip_grad_norm = 0;  // 0 = off
    std::string device = "cpu";     // cpu | cuda | auto
    Precision precision = Precision::fp32;  // fp32 | bf16 | tf32 (cuda) | fp8
    Fp8Recipe fp8_recipe = Fp8Recipe::tensorwise;  // precision fp8: tensorwise | blockwise
    int64_t threads = 0;            // CPU threads per rank; 0 = the cores given to this rank
    // How the CPU multiplies bf16 inputs: "native" (oneDNN's bf16 matmul), "widened" (to f32, then dnnl_sgemm:
    // the same math on any x86-64), or "auto" (widened where oneDNN has no bf16 matmul or it runs clearly slower
    // than sgemm on a test GEMM at start; kernels/cpu/matmul.hpp).
    std::string cpu_bf16_gemm = "auto";
    std::string time_limit;         // e.g. "3h50m"; empty = none
    std::string recompute = "none"; // none | blocks: keep only each transformer block's input, recompute in backward
    int64_t skip_nonfinite = 0;     // skip up to N consecutive steps with a non-finite loss or gradient norm; 0 = stop
  } train;
  struct Optimizer {
    std::string name = "adamw";  // adamw | sgd
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
    double momentum = 0.0;
    // ZeRO stage over the dp (x cp) replicas: 0 none; 1 optimizer state sharded; 2 gradients too (reduce-scattered
    // per bucket as the backward makes them); 3 parameters too (each block's gathered while it runs). true / false
    // mean 1 / 0.
    int zero = 0;
  } optimizer;
  struct LrSchedule {
    std::string name = "constant";  // constant | cosine
    int64_t warmup_steps = 0;
    double min_lr = 0.0;
  } lr_schedule;
  struct Parallel {
    int64_t dp = 1, pp = 1;
    int64_t tp = 1;                 // tensor parallelism (language models): world = dp x cp x tp x pp, tp fastest
    int64_t cp = 1;                 // context parallelism (language models): each sequence split over cp ranks
    int64_t ep = 1;                 // expert parallelism (MoE): each MoE layer's experts split over ep of the dp ranks
    bool sequence_parallel = false; // with tp > 1: norms and residuals on 1/tp of the rows (Megatron-LM's)
    std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb-h1
    int64_t virtual_stages = 1;
    std::vector<int64_t> balance;   // layers per chunk; empty = balanced by FLOPs
    // With pp > 1 and no balance: the bytes (GiB) a pipeline rank may hold. The partition keeps every stage's planned
    // memory within it and balances compute among the partitions that do (parallel/partition.hpp); 0: compute alone.
    double stage_memory_gib = 0;
    double bucket_mb = 25.0;
    double first_bucket_mb = 1.0;   // the first bucket the backward fills (PyTorch DDP's 1 MiB): communication starts early
    std::string comm = "auto";      // auto | nccl | mpi
    GradReduce grad_reduce = GradReduce::fp32;  // the gradient all-reduce / reduce-scatter wire type
    // ZeRO-3 on one pipeline stage: free a block's gathered parameters after its forward (and gather them again
    // for its backward); false keeps them from first use to the end of the step (always so when pp > 1).
    bool reshard_after_forward = true;
    // Communication overlap (issue 40): a progress thread moves the non-blocking collectives while the rank computes,
    // and each gradient bucket is reduced as soon as the last micro-batch's backward has filled it (DDP's rule).
    // false: today's order (a chunk's buckets at its allreduce_grads action, advanced only between actions).
    bool overlap = true;
    // ZeRO-3 with train.precision = "fp8" (tensorwise): gather the linear layers' weights as e4m3 codes and one
    // scale per tensor (half of bf16's bytes) and feed the codes to the FP8 GEMMs (torchtitan's Float8 all-gather).
    bool fp8_param_gather = false;
    std::string timeout = "10m";    // progress watchdog; "0" = off
  } parallel;
  struct Log {
    bool tensorboard = false;  // TensorBoard event files under <run.dir>/tb (rank 0)
  } log;
  // Mixture-of-experts training (a family with experts, ModelKeys::has_experts). expert_bias: DeepSeek-V3's auxiliary-
  // loss-free balancing: a per-expert bias added to the router's probabilities for the top-k choice only, updated
  // after every optimizer step from the global batch's token counts, b_e += bias_update_rate x sign(mean(c) - c_e).
  struct Moe {
    bool expert_bias = false;
    double bias_update_rate = 0.001;
  } moe;
  struct Trace {
    int64_t first = 0, last = -1;  // steps = [first, last]; off when last < first (the default)
    bool on() const { return last >= first && first >= 1; }
  } trace;
  struct Checkpoint {
    std::string dir;         // default <run.dir>/checkpoints
    int64_t every = 0;       // 0 = only at the end
    int64_t keep = 0;        // 0 = keep all
    bool save_initial = false;
    std::string resume = "none";  // none | auto | a path
    bool async = false;      // rank 0 writes the file in a background thread (train/checkpoint_writer.hpp)
  } checkpoint;

  // The effective configuration as TOML text (every key, defaults filled in); loading it back gives
  // the same Config. family: model.type's (model/family.hpp's to_toml(cfg) finds it).
  std::string to_toml(const ModelKeys& family) const;
};

// Loads and validates. overrides are "section.key=value" strings (value in TOML syntax, or a bare
// string). Throws relay::Error naming the file and key on any problem. families: every model.type and its
// [model] keys (core/config_keys.hpp); model/family.hpp's load_config and parse_config_text pass the registry.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const std::vector<const ModelKeys*>& families);
Config parse_config_text(const std::string& text, const std::string& source, const std::vector<std::string>& overrides,
                         const std::vector<const ModelKeys*>& families);

// Every key the parser accepts, as "section.key" in sorted order; [model]'s include every family's own keys. The
// configuration reference (docs/configuration.md) names exactly these (tests/test_docs.cpp).
std::vector<std::string> config_keys(const std::vector<const ModelKeys*>& families);

// "3h50m", "90m", "45s", "2h", "01:30:00", "3600" -> seconds. Throws Error naming `key`.
double parse_duration(const std::string& text, const std::string& key);

}  // namespace relay
