// One rank's training run. Setup runs in phases separated by agree_on_errors, so a user mistake
// seen by any rank ends every rank cleanly; the step loop keeps all ranks in lockstep by
// design (the loss, stop flag and gradient norm are reduced every step).
#include "train/trainer.hpp"

#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "comm/mpi_communicator.hpp"
#include "io/dataset.hpp"
#include "io/prefetcher.hpp"
#include "parallel/executor.hpp"
#include "parallel/simulator.hpp"
#include "train/checkpointing.hpp"
#include "train/metrics.hpp"
#include "train/signals.hpp"
#ifdef RELAY_HAVE_CUDA
#include "comm/nccl_communicator.hpp"
#endif

namespace fs = std::filesystem;

namespace relay {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU threads for this rank: train.threads, else OMP_NUM_THREADS, else the cores this process may
// use (its affinity mask) shared among the ranks of this node when they were not bound.
int threads_for_rank(const Config& cfg, int local_size) {
  if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
  if (const char* e = std::getenv("OMP_NUM_THREADS"))
    if (std::atoi(e) > 0) return std::atoi(e);
  cpu_set_t set;
  int affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (affinity < hw) return std::max(1, affinity);  // bound by the launcher: use what we were given
  return std::max(1, affinity / std::max(1, local_size));
}

Device resolve_device(const std::string& d) {
  if (d == "cpu") return Device::cpu;
  if (d == "cuda") return Device::cuda;
  return cuda_device_count() > 0 ? Device::cuda : Device::cpu;
}

struct Run {
  const Config& cfg;
  ProcessGrid grid;
  std::unique_ptr<Backend> be;
  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> dp_comm, pp_comm;
  std::optional<Hdf5Dataset> train_data, eval_data;
  ModelLayout layout;
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  std::map<int, ModelChunk*> chunk_map;
  std::unique_ptr<Loss> loss;
  std::unique_ptr<GradBuckets> buckets;
  std::unique_ptr<Optimizer> optimizer;
  std::map<std::string, Param*> params;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Prefetcher> prefetcher;
  ScheduleShape shape{};
  int64_t mb_rows = 0, replica_rows = 0, start_step = 0;
  double predicted_bubble = 0;

  explicit Run(const Config& c) : cfg(c) {}
};

void setup_grid_and_backend(Run& r) {
  const Config& cfg = r.cfg;
  r.grid = make_process_grid(static_cast<int>(cfg.parallel.dp), static_cast<int>(cfg.parallel.pp));
  set_process_identity(r.grid.world_rank, r.grid.host);
  BackendOptions bo;
  bo.device = resolve_device(cfg.train.device);
  bo.threads = threads_for_rank(cfg, r.grid.local_size);
  bo.precision = cfg.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  if (bo.device == Device::cuda) {
    int n = cuda_device_count();
    if (n == 0) throw Error("train.device = \"cuda\" but no CUDA device is visible (hint: check CUDA_VISIBLE_DEVICES, or use train.device = \"cpu\")");
    bo.gpu = r.grid.local_rank % n;
  }
  r.be = make_backend(bo);
}

void setup_communicators(Run& r) {
  r.world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, *r.be);
  bool nccl = r.be->device() == Device::cuda && r.cfg.parallel.comm != "mpi";
  if (r.cfg.parallel.comm == "nccl" && r.be->device() != Device::cuda)
    throw Error("parallel.comm = \"nccl\" needs train.device = \"cuda\"");
#ifdef RELAY_HAVE_CUDA
  if (nccl) {
    r.dp_comm = make_nccl_communicator(r.grid.dp_comm, *r.be, /*point_to_point=*/false);
    r.pp_comm = make_nccl_communicator(r.grid.pp_comm, *r.be);
    return;
  }
#else
  (void)nccl;
#endif
  r.dp_comm = std::make_unique<MpiCommunicator>(r.grid.dp_comm, *r.be);
  r.pp_comm = std::make_unique<MpiCommunicator>(r.grid.pp_comm, *r.be);
}

void setup_data_and_model(Run& r) {
  const Config& cfg = r.cfg;
  const ProcessGrid& g = r.grid;
  LossKind lk = parse_loss(cfg.model.loss);
  int64_t out_dim = model_output_dim(cfg.model.layers);
  // Every rank reads the file's shapes; only the last stage, which reads targets, checks class ranges.
  DatasetSpec spec;
  spec.targets = lk == LossKind::cross_entropy ? TargetKind::class_index : TargetKind::dense;
  if (g.is_last_stage()) {
    if (lk == LossKind::cross_entropy) spec.num_classes = out_dim;
    else spec.target_dim = out_dim;
  }
  r.train_data.emplace(cfg.data.train, spec, "data.train");
  const int64_t D = r.train_data->features();
  if (!cfg.data.eval.empty()) {
    DatasetSpec es = spec;
    es.features = D;
    r.eval_data.emplace(cfg.data.eval, es, "data.eval");
  }
  const int64_t B = cfg.train.batch_size;
  r.mb_rows = micro_batch_rows(cfg);
  r.replica_rows = r.mb_rows * cfg.train.micro_batches;

  r.layout = make_layout(cfg, D);
  r.shape = schedule_shape(cfg);
  auto lists = generate_all(r.shape);
  SimResult sim = simulate(r.shape, lists, Costs{});  // rejects deadlocks before anything runs
  r.predicted_bubble = sim.bubble_fraction;

  // This rank's chunks: c = pp_rank, pp_rank + pp, ...
  std::vector<Param*> my_params;
  std::vector<int> layer_of;
  for (int c = g.pp_rank; c < r.layout.num_chunks(); c += g.pp) {
    const ChunkRange& cr = r.layout.chunks[static_cast<size_t>(c)];
    std::vector<std::unique_ptr<Layer>> layers;
    for (int i = cr.begin; i < cr.end; ++i)
      layers.push_back(make_layer(*r.be, cfg.model.layers[static_cast<size_t>(i)], i,
                                  r.layout.shapes[static_cast<size_t>(i)], cfg.model.seed));
    auto ch = std::make_unique<ModelChunk>(*r.be, c, std::move(layers), c == 0, c == r.layout.num_chunks() - 1);
    for (Param* p : ch->params()) {
      my_params.push_back(p);
      layer_of.push_back(r.layout.layer_of_param(p->name));
      r.params[p->name] = p;
    }
    r.chunk_map[c] = ch.get();
    r.chunks.push_back(std::move(ch));
  }
  if (r.chunk_map.count(r.layout.num_chunks() - 1)) r.loss = std::make_unique<Loss>(*r.be, lk, out_dim);
  r.buckets = std::make_unique<GradBuckets>(*r.be, g.dp > 1 ? r.dp_comm.get() : nullptr, my_params, layer_of,
                                            cfg.parallel.bucket_mb);
  r.optimizer = make_optimizer(cfg.optimizer, *r.be, my_params);
  r.executor = std::make_unique<Executor>(*r.be, g, *r.pp_comm, r.chunk_map, r.loss.get(), *r.buckets, r.shape,
                                          lists[static_cast<size_t>(g.pp_rank)], r.mb_rows, B);
}

struct EvalResult { double loss = 0, accuracy = 0; };

EvalResult evaluate(Run& r) {
  const ProcessGrid& g = r.grid;
  const Hdf5Dataset& ev = *r.eval_data;
  const int64_t N = ev.samples();
  // Replica d scores rows [d*N/dp, (d+1)*N/dp) in batches of at most the replica's training rows.
  const int64_t lo = g.dp_rank * N / g.dp, hi = (g.dp_rank + 1) * N / g.dp;
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<int64_t> rows;
  std::vector<float> inputs, dense;
  std::vector<int32_t> cls;
  for (int64_t at = lo; at < hi; at += r.replica_rows) {
    int64_t n = std::min(r.replica_rows, hi - at);
    rows.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = at + i;
    StepData d;
    if (g.is_first_stage()) {
      inputs.resize(static_cast<size_t>(n * ev.features()));
      ev.read_inputs(rows, inputs.data());
      d.inputs = inputs.data();
    }
    if (g.is_last_stage()) {
      if (ev.target_kind() == TargetKind::class_index) {
        cls.resize(static_cast<size_t>(n));
        ev.read_targets(rows, cls.data());
        d.class_targets = cls.data();
      } else {
        dense.resize(static_cast<size_t>(n * ev.target_dim()));
        ev.read_targets(rows, dense.data());
        d.dense_targets = dense.data();
      }
    }
    double ls = 0;
    int64_t c = 0;
    r.executor->evaluate(n, d, ls, c);
    loss_sum += ls;
    correct += c;
  }
  double v[2] = {loss_sum, double(correct)};
  r.world->allreduce_host(v, 2, ReduceOp::sum);
  return {v[0] / double(N), v[1] / double(N)};
}

}  // namespace

int run_training(const Config& cfg) {
  const double t_start = now_s();
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
  CheckpointContext ckpt{cfg, g, r.layout, *r.be, r.params, *r.optimizer, r.train_data->samples()};
  std::string resume_path;
  agree_on_errors(MPI_COMM_WORLD, [&] {
    resume_path = resolve_resume_path(cfg);
    if (!resume_path.empty()) r.start_step = load_checkpoint(ckpt, resume_path);
  });
  std::unique_ptr<MetricsLog> log;
  agree_on_errors(MPI_COMM_WORLD, [&] {
    if (!rank0) return;
    fs::create_directories(cfg.run.dir);
    {
      std::ofstream f(cfg.run.dir + "/config.toml", std::ios::trunc);
      if (!f) throw Error(cat("run.dir: cannot write ", cfg.run.dir, "/config.toml"));
      f << cfg.to_toml();
    }
    log = std::make_unique<MetricsLog>(cfg.run.dir + "/metrics.jsonl", resume_path.empty() ? -1 : r.start_step);
    std::printf("relay: effective config (saved as %s/config.toml)\n%s\n", cfg.run.dir.c_str(), cfg.to_toml().c_str());
    std::printf("relay: %d rank%s = dp %d x pp %d, schedule %s (v=%lld, %lld micro-batches of %lld), backend %s\n",
                g.world_size, g.world_size > 1 ? "s" : "", g.dp, g.pp, cfg.parallel.schedule.c_str(),
                static_cast<long long>(cfg.parallel.virtual_stages), static_cast<long long>(cfg.train.micro_batches),
                static_cast<long long>(r.mb_rows), r.be->describe().c_str());
    std::printf("relay: model %lld parameters, stages:\n%s", static_cast<long long>(r.layout.param_count()),
                describe_partition(r.layout.chunks, r.layout.layers, g.pp).c_str());
    std::printf("relay: simulated pipeline bubble %.1f%% (equal F/B/W costs)\n", 100.0 * r.predicted_bubble);
    if (!resume_path.empty())
      std::printf("relay: resumed from %s at step %lld\n", resume_path.c_str(), static_cast<long long>(r.start_step));
    std::fflush(stdout);
  });

  const int64_t steps = cfg.train.steps, B = cfg.train.batch_size;
  SamplerSpec sampler{r.train_data->samples(), B, cfg.data.shuffle, cfg.data.seed};
  bool want_in = g.is_first_stage(), want_tg = g.is_last_stage();
  if ((want_in || want_tg) && r.start_step < steps)
    r.prefetcher = std::make_unique<Prefetcher>(*r.train_data, sampler, r.start_step, g.dp_rank * r.replica_rows,
                                                r.replica_rows, want_in, want_tg);
  const double time_limit = cfg.train.time_limit.empty() ? 0 : parse_duration(cfg.train.time_limit, "train.time_limit");

  if (cfg.checkpoint.save_initial && r.start_step == 0) save_checkpoint(ckpt, 0);

  double last_ckpt_s = 0, window_t0 = now_s(), loop_t0 = now_s();
  int64_t window_steps = 0;
  double compute_sum = 0, wait_sum = 0, stepwall_sum = 0;
  int64_t stat_steps = 0;
  for (int64_t step = r.start_step + 1; step <= steps; ++step) {
    StepData data;
    if (r.prefetcher) {
      const HostBatch& hb = r.prefetcher->next();
      data.inputs = hb.inputs.empty() ? nullptr : hb.inputs.data();
      data.class_targets = hb.class_targets.empty() ? nullptr : hb.class_targets.data();
      data.dense_targets = hb.dense_targets.empty() ? nullptr : hb.dense_targets.data();
    }
    StepStats st = r.executor->run_step(data);
    compute_sum += st.compute_s;
    wait_sum += st.wait_s;
    stepwall_sum += st.step_s;
    ++stat_steps;
    // Gradient norm over all stages (replicas hold equal gradients after the all-reduce).
    double sq = r.buckets->sum_squares();
    r.pp_comm->allreduce_host(&sq, 1, ReduceOp::sum);
    const double norm = std::sqrt(sq);
    // Rank 0 decides the time limit; any rank's signal counts.
    double elapsed = now_s() - t_start;
    double avg_step = (now_s() - loop_t0) / double(step - r.start_step);
    bool out_of_time = rank0 && time_limit > 0 && elapsed + 2 * avg_step + 1.5 * last_ckpt_s >= time_limit;
    double loss_sum = st.loss_sum, stop_flag = (stop_requested() || out_of_time) ? 1.0 : 0.0;
    r.world->allreduce_host(&loss_sum, 1, ReduceOp::sum);
    r.world->allreduce_host(&stop_flag, 1, ReduceOp::max);
    const double loss = loss_sum / double(B);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      std::string msg = cat("the loss is ", loss, " (gradient norm ", norm, ") at step ", step,
                            "; training stopped (hint: lower optimizer.lr, set train.clip_grad_norm, or check the data)");
      if (rank0) print_error(msg);
      throw AgreedError(msg);
    }
    const double clip = clip_factor(norm, cfg.train.clip_grad_norm);
    if (clip < 1.0) r.buckets->scale(static_cast<float>(clip));
    const double lr = learning_rate(cfg.lr_schedule, cfg.optimizer.lr, step, steps);
    r.optimizer->step(lr);
    ++window_steps;
    if (rank0 && (step % cfg.train.log_every == 0 || step == steps)) {
      double t = now_s(), sps = double(window_steps * B) / std::max(1e-9, t - window_t0);
      log->train({step, loss, lr, norm, sps, t - t_start, avg_step * double(steps - step)});
      window_t0 = t;
      window_steps = 0;
    }
    if (r.eval_data && ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || step == steps)) {
      EvalResult e = evaluate(r);
      if (rank0) log->eval(step, e.loss, e.accuracy, r.loss ? r.loss->kind() == LossKind::cross_entropy : cfg.model.loss == "cross_entropy");
    }
    const bool stop = stop_flag > 0 && step < steps;
    if ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || step == steps || stop) {
      double t = now_s();
      save_checkpoint(ckpt, step);
      last_ckpt_s = now_s() - t;
    }
    if (stop) {
      if (rank0) {
        std::printf("relay: stopping at step %lld on %s; checkpoint written, exit code %d (resumable)\n",
                    static_cast<long long>(step),
                    stop_signal() ? cat("signal ", stop_signal()).c_str() : "train.time_limit", kExitResumable);
        std::fflush(stdout);
      }
      return kExitResumable;
    }
  }
  if (rank0 && stat_steps > 0)
    std::printf("relay: done. rank 0 per step: compute %.4f s, waiting %.4f s (%.1f%% idle; simulated bubble %.1f%%)\n",
                compute_sum / double(stat_steps), wait_sum / double(stat_steps),
                100.0 * wait_sum / std::max(1e-12, stepwall_sum), 100.0 * r.predicted_bubble);
  if (rank0) std::printf("relay: results in %s (metrics.jsonl, config.toml, checkpoints/)\n", cfg.run.dir.c_str());
  std::fflush(stdout);
  // Per-rank idle time for benchmarks: RELAY_STAGE_STATS=1 prints every rank's measured wait.
  if (std::getenv("RELAY_STAGE_STATS") && stat_steps > 0) {
    std::printf("stage-stats rank %d pp_rank %d dp_rank %d compute_s %.6f wait_s %.6f step_s %.6f\n", g.world_rank,
                g.pp_rank, g.dp_rank, compute_sum / double(stat_steps), wait_sum / double(stat_steps),
                stepwall_sum / double(stat_steps));
    std::fflush(stdout);
  }
  free_process_grid(r.grid);
  return 0;
}

}  // namespace relay
