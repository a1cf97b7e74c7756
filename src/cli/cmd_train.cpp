// relay train --config FILE [--set section.key=value ...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "comm/progress.hpp"
#include "comm/watchdog.hpp"
#include "parallel/process_grid.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "model/family.hpp"
#include "plan/cluster.hpp"
#include "plan/step_model.hpp"
#include "train/memory_plan.hpp"
#include "train/model_layout.hpp"
#include <nlohmann/json.hpp>
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace relay {

CLI::App* add_train_command(CLI::App& app, TrainOptions& o) {
  auto* c = app.add_subcommand("train", "Train the model a TOML config describes (run under mpirun/srun for dp x pp ranks)");
  c->add_option("--config,-c", o.config, "TOML config file")->required();
  c->add_option("--set", o.overrides, "Override a key: --set section.key=value (TOML value syntax)")
      ->allow_extra_args(false);
  c->add_option("--plan-cluster", o.plan_cluster, "Predict this run on the cluster file's machine (relay plan --cluster; "
                                                  "for this machine the file relay plan --measure --calibrate wrote): the "
                                                  "prediction is metrics.jsonl's first record, compared with the run at "
                                                  "its end");
  c->footer("Exit codes: 0 done; 75 stopped early by SIGTERM/SIGUSR1 or train.time_limit after writing a "
            "checkpoint (resumable: rerun with checkpoint.resume = \"auto\"); 1 error; 74 a rank stalled "
            "(parallel.timeout); 76 an in-job restart would repeat the failure before it.");
  return c;
}

namespace {

// The planner's prediction for this run's layout on the cluster file's machine (plan/step_model.hpp).
RunPrediction predict_run(const std::string& cluster_file, const Config& cfg) {
  if (!model_family(cfg).language_model())
    throw Error(cat("--plan-cluster: the planner predicts language models (model.type = ",
                    family_names(&ModelKeys::language_model), ")"));
  const Cluster cl = load_cluster(cluster_file);
  const StepPrediction p = predict_step(cl, cfg);
  RunPrediction r;
  r.step_time_s = p.step_time_s;
  r.compute_s = p.compute_s;
  r.wait_s = p.step_time_s - p.compute_s;
  r.memory_bytes = double(predict_memory(cfg, make_layout(cfg, 0), 0, 0).total());
  r.json = nlohmann::json{{"step_time_s", p.step_time_s}, {"tokens_per_s_per_device", p.tokens_per_s_per_device},
                          {"memory_bytes_per_device", p.memory_bytes_per_device}, {"mfu", p.mfu},
                          {"bubble_fraction", p.bubble_fraction}, {"exposed_comm_s", p.exposed_comm_s},
                          {"compute_s", p.compute_s}, {"cluster", cl.name}, {"calibration", cluster_file},
                          {"layout", describe_layout(cfg)}}.dump();
  return r;
}

}  // namespace

int run_train_command(const TrainOptions& o, int argc, char** argv) {
  // Before MPI_Init: a SIGUSR1/SIGTERM that arrives during start-up must set the stop flag, not kill us.
  catch_stop_signals();
  int provided = 0;
  // MULTIPLE: with parallel.overlap a progress thread tests the collectives while this thread computes (and keeps
  // making its own MPI calls); a library that gives less runs without it (today's order).
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
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
    // parallel.overlap: the collectives move while this rank computes (stopped before MPI_Finalize, and on any
    // error as the stack unwinds: it never keeps a failing job alive).
    std::unique_ptr<ProgressThread> progress;
    if (cfg.parallel.overlap && size > 1 && ProgressThread::supported()) {
      progress = std::make_unique<ProgressThread>();
      set_active_progress(progress.get());
    }
    RunPrediction plan;
    if (!o.plan_cluster.empty())
      agree_on_errors(MPI_COMM_WORLD, [&] { plan = predict_run(o.plan_cluster, cfg); });
    code = run_training(cfg, plan);
    set_active_progress(nullptr);
    progress.reset();
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
