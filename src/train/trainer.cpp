// One rank's training session: the run directory's lock, setup in phases separated by agree_on_errors (so a user
// mistake seen by any rank ends every rank cleanly), the resume, the in-job restart check, the log, then the step
// loop (train/step_loop.hpp), and the final report or the stop's.
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>


#include "comm/agree.hpp"
#include "core/memory.hpp"
#include "model/family.hpp"
#include "train/checkpoint_writer.hpp"
#include "train/checkpointing.hpp"
#include "train/memory_plan.hpp"
#include "train/metrics.hpp"
#include "train/restarts.hpp"
#include "train/run_lock.hpp"
#include "train/run_state.hpp"
#include "train/signals.hpp"
#include "train/step_loop.hpp"
#include "train/stragglers.hpp"

namespace fs = std::filesystem;

namespace relay {

namespace {

// Rank 0, at the end of a run with a prediction: predicted vs measured, and a warning naming the part of the model that
// was off when the step time is more than 25% away (compute, or the waiting: bubble and exposed communication), or the
// memory more than 10%. Measured step: the mean of the steps after the first; compute and waiting: rank 0's, every
// step; memory: rank 0's tensors after the first step.
void compare_with_plan(const RunPrediction& p, double step_s, double compute_s, double wait_s, double mem) {
  auto row = [](const char* what, double predicted, double measured, const char* unit, double scale) {
    std::printf("  %-10s %12.4f %12.4f %+8.1f%%  %s\n", what, predicted * scale, measured * scale,
                100 * (measured - predicted) / std::max(1e-12, predicted), unit);
  };
  std::printf("relay: plan vs measured (rank 0; the step after the first):\n  %-10s %12s %12s %9s\n", "", "predicted",
              "measured", "error");
  row("step", p.step_time_s, step_s, "s", 1);
  row("compute", p.compute_s, compute_s, "s", 1);
  row("waiting", p.wait_s, wait_s, "s (bubble and exposed communication)", 1);
  row("memory", p.memory_bytes, mem, "MiB (tensors)", 1.0 / (1 << 20));
  const double off = (step_s - p.step_time_s) / p.step_time_s;
  if (std::abs(off) > 0.25) {
    const bool compute = std::abs(compute_s - p.compute_s) >= std::abs(wait_s - p.wait_s);
    std::printf("relay: warning: the step took %.0f%% %s time than planned; the part most off: %s\n", 100 * std::abs(off),
                off > 0 ? "more" : "less",
                compute ? cat("compute (predicted ", p.compute_s, " s, measured ", compute_s, " s)").c_str()
                        : cat("the bubble and collectives (predicted ", p.wait_s, " s of waiting, measured ", wait_s,
                              " s)").c_str());
  }
  if (std::abs(mem - p.memory_bytes) > 0.1 * p.memory_bytes)
    std::printf("relay: warning: memory is %.0f%% off the plan (predicted %s MiB, measured %s MiB)\n",
                100 * std::abs(mem - p.memory_bytes) / p.memory_bytes, mib(int64_t(p.memory_bytes)).c_str(),
                mib(int64_t(mem)).c_str());
}

// Rank 0: the run directory, the saved config and the start-up report.
std::unique_ptr<MetricsLog> start_log(Run& r, const std::string& resume_path) {
  const Config& cfg = r.cfg;
  const ProcessGrid& g = r.grid;
  fs::create_directories(cfg.run.dir);
  {
    std::ofstream f(cfg.run.dir + "/config.toml", std::ios::trunc);
    if (!f) throw Error(cat("run.dir: cannot write ", cfg.run.dir, "/config.toml"));
    f << to_toml(cfg);
  }
  for (const auto& name : remove_stale_temporaries(cfg.checkpoint.dir))
    std::printf("relay: removed %s/%s, left by a checkpoint writer that died\n", cfg.checkpoint.dir.c_str(), name.c_str());
  auto log = std::make_unique<MetricsLog>(cfg.run.dir + "/metrics.jsonl", resume_path.empty() ? -1 : r.start_step,
                                          r.layout.model.language_model ? r.layout.model.seq_len : 0);
  if (cfg.log.tensorboard) log->enable_tensorboard(cfg.run.dir + "/tb");
  std::printf("relay: effective config (saved as %s/config.toml)\n%s\n", cfg.run.dir.c_str(), to_toml(cfg).c_str());
  std::printf("relay: %d rank%s = dp %d%s x %s%spp %d, schedule %s (v=%lld, %lld micro-batches of %lld), backend %s\n",
              g.world_size, g.world_size > 1 ? "s" : "", g.dp, g.ep > 1 ? cat(" (ep ", g.ep, ")").c_str() : "",
              g.cp > 1 ? cat("cp ", g.cp, " x ").c_str() : "",
              g.tp > 1 ? cat("tp ", g.tp, " x ").c_str() : "", g.pp,
              cfg.parallel.schedule.c_str(),
              static_cast<long long>(cfg.parallel.virtual_stages), static_cast<long long>(cfg.train.micro_batches),
              static_cast<long long>(r.mb_rows), r.be->describe().c_str());
  // Until a GPU session has run test_backend_ops' fp8 rows and test_gpu_training_mpi's fp8 cases (issue 44).
  if (cfg.train.precision == Precision::fp8 && r.be->device() == Device::cuda)
    std::printf("relay: note: the CUDA FP8 path (cuBLASLt FP8 GEMMs, quantisation kernels) has not yet been verified "
                "on a GPU; the CPU backend's fp8 is the checked reference\n");
  if (cfg.optimizer.zero && g.replicas() > 1)
    std::printf("relay: ZeRO-%d: each of the %d replicas keeps 1/%d of the optimizer state%s and updates that piece\n",
                cfg.optimizer.zero, g.replicas(), g.replicas(),
                cfg.optimizer.zero >= 2 ? " and of the gradients (each bucket reduce-scattered as the backward makes it)"
                                        : "");
  if (g.ep > 1) {
    int64_t E = 0;
    for (const BlockSpec& b : r.layout.model.blocks)
      if (b.moe.on()) E = b.moe.n_experts;
    std::printf("relay: expert parallelism: each MoE layer's %lld experts over ep %d of the dp ranks, %lld each (ep rank "
                "r holds experts [%lld r, %lld (r + 1))); rows travel to their experts and back in all-to-alls; each "
                "expert's gradients summed over the %d rank%s holding it%s\n",
                static_cast<long long>(E), g.ep, static_cast<long long>(E / g.ep), static_cast<long long>(E / g.ep),
                static_cast<long long>(E / g.ep), g.expert_replicas(), g.expert_replicas() > 1 ? "s" : "",
                !cfg.optimizer.zero || g.replicas() == 1 ? ""
                : g.expert_replicas() > 1 ? " (ZeRO shards them over those ranks)"
                                          : " (no other copy: ZeRO keeps them whole)");
  }
  if (g.cp > 1)
    std::printf("relay: context parallelism: each sequence of %lld tokens is cut into %d chunks; rank i of a cp group "
                "holds chunks i and %d - i (%lld tokens) and attends to the group's gathered keys and values\n",
                static_cast<long long>(r.layout.model.seq_len), 2 * g.cp, 2 * g.cp - 1,
                static_cast<long long>(r.layout.model.seq_len / g.cp));
  if (cfg.parallel.sequence_parallel)
    std::printf("relay: sequence parallelism: between the projections (norms, residuals) each tp rank holds %lld of a "
                "micro-batch's %lld rows (1/%d); all-gathers before the column-parallel projections, reduce-scatters "
                "after the row-parallel ones\n",
                static_cast<long long>(r.mb_rows * r.layout.model.seq_len / g.cp / g.tp),
                static_cast<long long>(r.mb_rows * r.layout.model.seq_len / g.cp), g.tp);
  if (cfg.train.recompute == "blocks")
    std::printf("relay: recomputing transformer blocks in the backward (only their inputs are kept)\n");
  if (!r.preload_note.empty()) std::printf("relay: %s\n", r.preload_note.c_str());
  std::printf("relay: model %s, %lld parameters, stages:\n%s", cfg.model.type.c_str(),
              static_cast<long long>(r.layout.param_count()),
              describe_partition(r.layout.chunks, r.layout.blocks(), g.pp).c_str());
  for (auto& e : r.layout.shared_params())
    std::printf("relay: %s is tied across pipeline ranks %d and %d (gradients summed every step)\n", e.name.c_str(),
                e.pp_ranks.front(), e.pp_ranks.back());
  std::printf("relay: simulated pipeline bubble %.1f%% (equal F/B/W costs)\n", 100.0 * r.predicted_bubble);
  if (!resume_path.empty())
    std::printf("relay: resumed from %s at step %lld\n", resume_path.c_str(), static_cast<long long>(r.start_step));
  std::fflush(stdout);
  return log;
}

// Where every rank runs, gathered on rank 0 at start: host, node-local rank, CPU threads and device,
// each computed on its own host (what a multi-node job needs checked first).
std::string placement_table(Run& r) {
  const ProcessGrid& g = r.grid;
  constexpr int kLen = 160;
  char mine[kLen] = {};
  std::snprintf(mine, kLen, "  %s on %s: local rank %d of %d, %s%s", rank_label(g.world_rank, g.dp, g.tp, g.cp).c_str(),
                g.host.c_str(), g.local_rank, g.local_size, r.be->describe().c_str(),
                g.ep > 1 ? cat(", ep rank ", g.ep_rank).c_str() : "");
  // (world_size x kLen) chars on rank 0
  const std::vector<std::byte> all = r.world->gather_host(mine, kLen, 0, nullptr, "the placement report");
  std::string table;
  for (int i = 0; i < (g.world_rank == 0 ? g.world_size : 0); ++i)
    table += std::string(reinterpret_cast<const char*>(all.data()) + static_cast<size_t>(i) * kLen) + "\n";
  return table;
}

// Collective: the measured timelines into <run.dir>/trace.json, and the measured bubble beside the
// simulated one.
void write_trace(Run& r) {
  if (!r.tracer) return;
  const ProcessGrid& g = r.grid;
  const std::string path = r.cfg.run.dir + "/trace.json";
  const double bubble =
      r.tracer->write(path, rank_label(g.world_rank, g.dp, g.tp, g.cp));
  if (g.world_rank == 0) {
    std::printf("relay: trace of steps %lld-%lld in %s (open it in Perfetto or chrome://tracing); measured bubble "
                "%.1f%% of the traced steps, simulated %.1f%% (equal F/B/W costs)\n",
                static_cast<long long>(r.tracer->first()), static_cast<long long>(r.tracer->last()), path.c_str(),
                100.0 * bubble, 100.0 * r.predicted_bubble);
    std::fflush(stdout);
  }
}

void start_prefetcher(Run& r) {
  const ProcessGrid& g = r.grid;
  // Every stage reads the inputs under a document mask: each derives the micro-batches' document layout.
  const bool want_in = g.is_first_stage() || r.documents.on() || g.cp > 1, want_tg = g.is_last_stage();
  if (!(want_in || want_tg) || r.start_step >= r.cfg.train.steps) return;
  SamplerSpec sampler{r.train_data.samples(), r.cfg.train.batch_size, r.cfg.data.shuffle, r.cfg.data.seed};
  const int64_t begin = g.dp_rank * r.replica_rows;
  if (r.train_data.tokens)
    r.prefetcher = std::make_unique<Prefetcher>(*r.train_data.tokens, sampler, r.start_step, begin, r.replica_rows,
                                                want_in, want_tg);
  else
    r.prefetcher = std::make_unique<Prefetcher>(*r.train_data.features, sampler, r.start_step, begin, r.replica_rows,
                                                want_in, want_tg, r.executor->preloaded());
}

}  // namespace

int run_training(const Config& cfg, const RunPrediction& plan) {
  const double t_start = now_s();
  const std::unique_ptr<RunLock> run_lock = own_run_dir(cfg.run.dir);  // one job per run.dir; held to the end
  Run r(cfg);
  // Phase 1: grid (world size check) and backend. Every rank sees the same config, so the same error.
  agree_on_errors(MPI_COMM_WORLD, [&] { setup_grid_and_backend(r); });
  const ProcessGrid& g = r.grid;
  const bool rank0 = g.world_rank == 0;
  agree_on_errors(MPI_COMM_WORLD, [&] {
    setup_communicators(r);
    setup_data_and_model(r);
  });
  // Phase 3: resume, run directory, log.
  CheckpointContext ckpt{cfg, g, r.layout, *r.be, *r.world, *r.dp_comm, r.params, *r.optimizer, r.train_data.samples(),
                         r.train_data.tokens ? r.train_data.tokens->tokenizer() : std::string()};
  if (r.buckets->params_sharded()) ckpt.param_pieces = r.buckets->optimizer_slices();  // ZeRO-3
  ckpt.expert_dp = r.expert_dp_comm.get();
  if (cfg.moe.expert_bias) {  // zero until a checkpoint says otherwise
    int64_t layers = 0;
    for (const BlockSpec& b : r.layout.model.blocks)
      if (b.moe.on()) ++layers, ckpt.n_experts = b.moe.n_experts;
    r.expert_bias.assign(size_t(layers * ckpt.n_experts), 0.f);
    ckpt.expert_bias = &r.expert_bias;
  }
  std::string resume_path;
  agree_on_errors(MPI_COMM_WORLD, [&] {
    resume_path = resolve_resume_path(cfg);
    if (!resume_path.empty()) r.start_step = load_checkpoint(ckpt, resume_path);
    else if (!cfg.model.init_from.empty()) load_init_from(ckpt, cfg.model.init_from);
    for (auto& [name, p] : r.params) p->refresh_work(*r.be);  // bf16 copies of the loaded masters
    if (!r.expert_bias.empty()) push_expert_bias(r);
  });
  mem_reset_peaks();  // the peaks the report gives are the steps', not setup's or a checkpoint load's
  const std::string placement = placement_table(r);
  std::unique_ptr<MetricsLog> log;
  const RestartInfo restart = restart_from_env();
  std::string no_progress;  // rank 0: this restart would repeat the last one
  agree_on_errors(MPI_COMM_WORLD, [&] {
    if (!rank0) return;
    RestartVerdict v;  // read before start_log cuts metrics.jsonl back to the resume step
    if (restart.count > 0) v = judge_restart(cfg.run.dir + "/metrics.jsonl", r.start_step, restart);
    if (!(no_progress = v.no_progress).empty()) return;
    log = start_log(r, resume_path);
    if (plan.on() && r.start_step == 0) log->plan(plan.json);
    if (restart.count > 0) log->restart(r.start_step, restart.count, restart.cause, v.failed_after_step);
    std::printf("relay: placement\n%s", placement.c_str());
    std::fflush(stdout);
  });
  double repeat = no_progress.empty() ? 0 : 1;
  r.world->allreduce_host(&repeat, 1, ReduceOp::max, "the restart check");
  if (repeat > 0) {
    if (rank0) print_error(no_progress);
    teardown(r);
    return kExitNoProgress;
  }
  StragglerMonitor stragglers(g, *r.world);
  start_prefetcher(r);
  if (cfg.trace.on()) r.tracer = std::make_unique<Tracer>(*r.be, *r.world, cfg.trace.first, cfg.trace.last);
  CheckpointWriter writer(ckpt);  // after r: its destructor waits for a write in flight
  if (cfg.checkpoint.save_initial && r.start_step == 0) writer.save(0);

  LoopSetup setup{writer, log.get(), stragglers, restart.count, t_start};
  const LoopOutcome out = run_steps(r, setup);
  if (out.stopped) {
    writer.finish();
    if (rank0) {
      std::printf("relay: stopping at step %lld on %s; checkpoint written, exit code %d (resumable)\n",
                  static_cast<long long>(out.last_step),
                  out.stop_signal ? cat("signal ", out.stop_signal).c_str() : "train.time_limit", kExitResumable);
      std::fflush(stdout);
    }
    stragglers.report(out.totals.compute_s, out.totals.wait_s, out.totals.exposed_comm_s, out.last_step - r.start_step);
    write_trace(r);
    teardown(r);
    return kExitResumable;
  }
  writer.finish();
  const int64_t stat_steps = cfg.train.steps - r.start_step;
  const StepStats& totals = out.totals;
  if (rank0 && stat_steps > 0)
    std::printf("relay: done. rank 0 per step: compute %.4f s, waiting %.4f s (%.1f%% idle; simulated bubble %.1f%%)\n",
                totals.compute_s / double(stat_steps), totals.wait_s / double(stat_steps),
                100.0 * totals.wait_s / std::max(1e-12, totals.step_s), 100.0 * r.predicted_bubble);
  if (rank0 && plan.on() && stat_steps > 1)
    compare_with_plan(plan, out.steps_after_first_s / double(stat_steps - 1), totals.compute_s / double(stat_steps),
                      totals.wait_s / double(stat_steps), out.memory_after_first);
  if (rank0) std::printf("relay: results in %s (metrics.jsonl, config.toml, checkpoints/)\n", cfg.run.dir.c_str());
  std::fflush(stdout);
  // Per-rank idle time for benchmarks: RELAY_STAGE_STATS=1 prints every rank's measured wait.
  if (std::getenv("RELAY_STAGE_STATS") && stat_steps > 0) {
    std::printf("stage-stats rank %d pp_rank %d dp_rank %d compute_s %.6f wait_s %.6f step_s %.6f\n", g.world_rank,
                g.pp_rank, g.dp_rank, totals.compute_s / double(stat_steps), totals.wait_s / double(stat_steps),
                totals.step_s / double(stat_steps));
    std::fflush(stdout);
  }
  stragglers.report(totals.compute_s, totals.wait_s, totals.exposed_comm_s, stat_steps);
  write_trace(r);
  teardown(r);
  return 0;
}

}  // namespace relay
