// Subcommands of the relay binary, one file each (micromamba's layout): an options struct, a
// function that registers it with CLI11, and a run function returning the exit code.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "plan/cost_model.hpp"

namespace relay {

struct TrainOptions { std::string config, plan_cluster; std::vector<std::string> overrides; };
CLI::App* add_train_command(CLI::App& app, TrainOptions& o);
int run_train_command(const TrainOptions& o, int argc, char** argv);

struct PlanOptions {
  std::string config, trace;
  std::vector<std::string> overrides;
  bool measure = false;
  int64_t input_dim = 0;
  // --cluster: the cluster-scale planner (cmd_plan_cluster.cpp)
  std::string cluster;
  int nodes = 0;
  int64_t global_batch = 0, seq = 0;
  int top = 5;
  bool layout = false, json = false;
  double device_mtbf_hours = 0;  // 0 = the default (cmd_plan_cluster.cpp cites it)
  std::string calibrate;         // with --measure: write this machine as a cluster file (plan/calibration.hpp)
  PlannedAttention attention = PlannedAttention::flash;  // --attention (plan/cost_model.hpp)
  PlannedElementwise elementwise = PlannedElementwise::fused;  // --elementwise (plan/cost_model.hpp)
};
CLI::App* add_plan_command(CLI::App& app, PlanOptions& o);
int run_plan_command(const PlanOptions& o);
int run_plan_cluster(const PlanOptions& o);

struct DataOptions {
  std::string out, file;
  std::vector<std::string> inputs;                 // tokenize
  std::string tokenizer, vocab, merges, eval_out;  // tokenize
  std::string tokenizer_json;                      // tokenize --tokenizer hf
  std::string format = "text", field = "text", doc_separator, on_bad_record = "error";  // tokenize: the corpus
  int64_t eot_id = -1;  // tokenize: the documents' separator; -1 = the tokenizer's end-of-text token
  int workers = 0;      // tokenize: threads; 0 = every core
  double eval_fraction = 0;
  int64_t samples = 0, features = 0, classes = 0;
  uint64_t seed = 0, teacher_seed = 1234;
};
CLI::App* add_data_command(CLI::App& app, DataOptions& o, CLI::App** synth, CLI::App** inspect, CLI::App** tokenize);
int run_data_tokenize(const DataOptions& o);
int run_data_synth(const DataOptions& o);
int run_data_inspect(const DataOptions& o);

struct GenerateOptions {
  std::string checkpoint, prompt, prompt_tokens, device = "cpu", tokens_out, logits_out;
  std::string precision;  // "" = the run's train.precision
  int64_t max_new_tokens = 0, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 1;
  std::vector<std::string> tokenizer_files;
  std::string tokenizer_json;  // tokenizer "hf"
};
CLI::App* add_generate_command(CLI::App& app, GenerateOptions& o);
int run_generate_command(const GenerateOptions& o);

struct CkptOptions {
  std::string file, out;
  std::string format = "safetensors";  // export: safetensors (one file, Relay's names) | hf (a transformers directory)
  std::string dtype = "fp32";          // export: fp32 | bf16
};
CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& o, CLI::App** inspect, CLI::App** export_cmd);
int run_ckpt_inspect(const CkptOptions& o);
int run_ckpt_export(const CkptOptions& o);

}  // namespace relay
