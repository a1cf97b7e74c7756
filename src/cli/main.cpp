// relay: hybrid data x pipeline parallel training over MPI. Thin: parses the command line and hands
// over to one subcommand; user errors are printed once, here, and give a non-zero exit code.
#include <cstdio>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "io/hdf5_util.hpp"

int main(int argc, char** argv) {
  relay::hdf5_disable_exit_cleanup();
  CLI::App app{"relay: hybrid data x pipeline parallel training over MPI (CPU: oneDNN, GPU: CUDA + NCCL)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "relay 0.1.0");
  relay::TrainOptions train;
  relay::PlanOptions plan;
  relay::DataOptions data;
  relay::CkptOptions ckpt;
  relay::GenerateOptions generate;
  CLI::App *synth = nullptr, *inspect = nullptr, *tokenize = nullptr, *ckpt_inspect = nullptr,
           *ckpt_export = nullptr;
  CLI::App* train_cmd = relay::add_train_command(app, train);
  CLI::App* plan_cmd = relay::add_plan_command(app, plan);
  relay::add_data_command(app, data, &synth, &inspect, &tokenize);
  relay::add_ckpt_command(app, ckpt, &ckpt_inspect, &ckpt_export);
  CLI::App* generate_cmd = relay::add_generate_command(app, generate);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (train_cmd->parsed()) return relay::run_train_command(train, argc, argv);
  try {
    if (plan_cmd->parsed()) return relay::run_plan_command(plan);
    if (synth->parsed()) return relay::run_data_synth(data);
    if (inspect->parsed()) return relay::run_data_inspect(data);
    if (tokenize->parsed()) return relay::run_data_tokenize(data);
    if (ckpt_inspect->parsed()) return relay::run_ckpt_inspect(ckpt);
    if (ckpt_export->parsed()) return relay::run_ckpt_export(ckpt);
    if (generate_cmd->parsed()) return relay::run_generate_command(generate);
  } catch (const relay::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
