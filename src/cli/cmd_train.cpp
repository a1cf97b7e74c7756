// relay train --config FILE [--set section.key=value ...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "comm/watchdog.hpp"
#include "parallel/process_grid.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace relay {

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  auto* c = app.add_subcommand("train", "Train the model a TOML config describes (run under mpirun/srun for dp x pp ranks)");
  c->add_option("--config,-c", o.config, "TOML config file")->required();
  c->add_option("--set", o.overrides, "Override a key: --set section.key=value (TOML value syntax)")
      ->allow_extra_args(false);
  c->footer("Exit codes: 0 done; 75 stopped early by SIGTERM/SIGUSR1 or train.time_limit after writing a "
            "checkpoint (resumable: rerun with checkpoint.resume = \"auto\"); 1 error; 74 a rank stalled "
            "(parallel.timeout); 76 an in-job restart would repeat the failure before it.");
  return c;
}

int run_train_command(const TrainOptions& o, int argc, char** argv) {
  // Before MPI_Init: a SIGUSR1/SIGTERM that arrives during start-up must set the stop flag, not kill us.
  catch_stop_signals();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  set_process_identity(rank, "");
  int code = 1;
  try {
    Config cfg;
    agree_on_errors(MPI_COMM_WORLD, [&] { cfg = load_config(o.config, o.overrides); });
    // From here on every blocking wait is watched (parallel.timeout).
    const double timeout = cfg.parallel.timeout == "0" ? 0 : parse_duration(cfg.parallel.timeout, "parallel.timeout");
    const int dp = static_cast<int>(std::max<int64_t>(1, cfg.parallel.dp));
    const int tp = static_cast<int>(std::max<int64_t>(1, cfg.parallel.tp));
    const int cp = static_cast<int>(std::max<int64_t>(1, cfg.parallel.cp));
    Watchdog watchdog(MPI_COMM_WORLD, timeout, [dp, tp, cp](int r) { return rank_label(r, dp, tp, cp); });
    set_active_watchdog(&watchdog);
    code = run_training(cfg);
    set_active_watchdog(nullptr);
  } catch (const AgreedError&) {
    code = 1;  // printed once by the rank that saw it; every rank got here
  } catch (const Error& e) {
    // Seen by this rank alone, mid-run: the others may be waiting on it, so end the whole job.
    print_error(e.what());
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    code = 1;
  } catch (const std::exception& e) {
    print_error(cat("unexpected: ", e.what()));
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    code = 1;
  }
  MPI_Finalize();
  return code;
}

}  // namespace relay
