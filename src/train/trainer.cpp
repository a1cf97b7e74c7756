// One rank's training run. Setup runs in phases separated by agree_on_errors, so a user mistake
// seen by any rank ends every rank cleanly; the step loop keeps all ranks in lockstep by design
// (the loss, stop flag and gradient norm are reduced every step).
#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/gpu_peaks.hpp"
#include "comm/agree.hpp"
#include "core/memory.hpp"
#include "comm/watchdog.hpp"
#include "model/family.hpp"
#include "train/checkpoint_writer.hpp"
#include "train/checkpointing.hpp"
#include "train/memory_plan.hpp"
#include "train/metrics.hpp"
#include "train/restarts.hpp"
#include "train/run_lock.hpp"
#include "train/run_state.hpp"
#include "train/signals.hpp"
#include "train/stragglers.hpp"

namespace fs = std::filesystem;

namespace relay {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// RELAY_VERIFY_TIED=1 (tests): after every update, the two pipeline ranks holding a tied weight, and
// the tp ranks holding a replicated parameter, compare 64-bit hashes of their copies' bytes; any
// difference ends the run with the step and name.
void verify_tied_copies(Run& r, int64_t step) {
  std::vector<float> host;
  auto same_everywhere = [&](Communicator& comm, const Param& p) {
    host.resize(static_cast<size_t>(p.value.numel()));
    r.be->download(host.data(), p.value);
    uint64_t h = 1469598103934665603ull;
    for (float f : host) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = (h ^ bits) * 1099511628211ull;
    }
    double lo = double(h >> 12), hi = lo;  // 52 bits: exact in a double
    comm.allreduce_host(&lo, 1, ReduceOp::min);
    comm.allreduce_host(&hi, 1, ReduceOp::max);
    return lo == hi;
  };
  if (r.tied_comm)
    for (auto& e : r.layout.shared_params())
      if (!same_everywhere(*r.tied_comm, *r.params.at(e.name)))
        throw Error(cat("the two copies of tied weight ", e.name, " differ after step ", step));
  if (r.tp_comm)
    for (auto& [name, p] : r.params)  // the same names, in the same order, on every tp rank of a stage
      if (!p->sharded() && !same_everywhere(*r.tp_comm, *p))
        throw Error(cat("the tensor-parallel copies of replicated parameter ", name, " differ after step ", step));
}

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;
  double input_wait_s = 0;  // waiting for the prefetcher's next batch
  bool stop = false;  // a stop signal or the time limit, agreed by every rank
  bool skipped = false;  // a non-finite loss or gradient norm: no update (train.skip_nonfinite)
  StepStats stats;
  // MoE models: the means of the load-balancing and z losses (model/moe.hpp; in `loss` with their coefficients) and
  // each MoE layer's largest and mean token count per expert over the global batch.
  double aux_loss = 0, z_loss = 0, margin = INFINITY;
  std::vector<double> load_max, load_mean;
  std::vector<double> tokens;  // (MoE layers, n_experts) tokens routed to each expert over the global batch
  double ep_alltoall_s = -1, ep_rows_sent = 0;  // parallel.ep: the slowest rank's all-to-all time; rows sent away
};

// moe.expert_bias: every block of this rank takes its layer's row of the run's bias.
void push_expert_bias(Run& r) {
  for (auto& ch : r.chunks)
    for (const auto& b : ch->blocks()) b->set_expert_bias(*r.be, r.expert_bias);
}

// moe.expert_bias after an optimizer step (DeepSeek-V3, arXiv:2412.19437): b_e += rate x sign(mean(c) - c_e), c the
// global batch's token counts of the layer; the same on every rank (the counts are the world's).
void update_expert_bias(Run& r, const StepResult& res) {
  const int64_t E = int64_t(res.tokens.size() / res.load_mean.size());
  const float rate = float(r.cfg.moe.bias_update_rate);
  for (size_t l = 0; l < res.load_mean.size(); ++l)
    for (int64_t e = 0; e < E; ++e) {
      const double c = res.tokens[l * size_t(E) + size_t(e)], mean = res.load_mean[l];
      float& b = r.expert_bias[l * size_t(E) + size_t(e)];
      b += c < mean ? rate : c > mean ? -rate : 0.f;
    }
  push_expert_bias(r);
}

// MoE models: the routers' statistics summed over every rank (a layer's once: tp rank 0's), into res; returns the
// loss's router terms, router_aux_loss_coef x mean aux + router_z_loss_coef x mean lse^2.
double router_terms(Run& r, StepResult& res) {
  int64_t layers = 0, E = 0;
  double aux_coef = 0, z_coef = 0;  // the model's, the same in every MoE layer
  for (const BlockSpec& b : r.layout.model.blocks)
    if (b.moe.on()) ++layers, E = b.moe.n_experts, aux_coef = b.moe.aux_coef, z_coef = b.moe.z_coef;
  if (layers == 0) return 0;
  std::vector<double> sums(size_t(2 + layers * E), 0.0);  // aux, z, then (layer, expert) token counts
  if (r.grid.tp_rank == 0)
    for (const RouterStats& s : res.stats.routers) {
      sums[0] += s.aux_sum;
      sums[1] += s.z_sum;
      for (int64_t e = 0; e < E; ++e) sums[size_t(2 + s.layer * E + e)] += s.tokens[size_t(e)];
    }
  r.world->allreduce_host(sums.data(), int(sums.size()), ReduceOp::sum, "the router statistics reduction");
  for (const RouterStats& s : res.stats.routers) res.margin = std::min(res.margin, s.min_margin);
  r.world->allreduce_host(&res.margin, 1, ReduceOp::min, "the router margin reduction");
  const double seqs = double(r.cfg.train.batch_size) * double(layers);
  res.aux_loss = sums[0] / seqs;
  res.z_loss = sums[1] / (seqs * double(r.layout.model.seq_len));
  res.tokens.assign(sums.begin() + 2, sums.end());
  for (int64_t l = 0; l < layers; ++l) {
    const double* t = sums.data() + 2 + l * E;
    res.load_max.push_back(*std::max_element(t, t + E));
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += t[e];
    res.load_mean.push_back(total / double(E));
  }
  return aux_coef * res.aux_loss + z_coef * res.z_loss;
}

// A step with a non-finite loss or gradient norm (every rank decides alike). train.skip_nonfinite
// consecutive ones are skipped, as Megatron-LM skips an iteration whose gradients overflowed: no
// clipping, no update, so the weights, the optimizer state and its update count stay as they were,
// while the step number and the data position advance (the batch is consumed; resuming a checkpoint
// gives the same sequence). One more, or any with skip_nonfinite = 0, stops the job.
void skip_nonfinite_step(Run& r, int64_t step, double loss, double grad_norm) {
  const int64_t limit = r.cfg.train.skip_nonfinite;
  if (++r.nonfinite_in_a_row > limit) {
    std::string msg = cat("the loss is ", loss, " (gradient norm ", grad_norm, ") at step ", step,
                          "; training stopped (hint: lower optimizer.lr, set train.clip_grad_norm, or check the data)");
    if (limit > 0) msg += cat(" after ", limit, " consecutive skipped steps (train.skip_nonfinite = ", limit, ")");
    if (r.grid.world_rank == 0) print_error(msg);
    throw AgreedError(msg);
  }
  if (r.grid.world_rank == 0) {
    std::printf("relay: step %lld skipped: the loss is %g (gradient norm %g); %lld of at most %lld in a row "
                "(train.skip_nonfinite)\n", static_cast<long long>(step), loss, grad_norm,
                static_cast<long long>(r.nonfinite_in_a_row), static_cast<long long>(limit));
    std::fflush(stdout);
  }
}

// One optimizer step: this step's batch, the schedule (forward, backward, all-reduces), the global
// loss and gradient norm, clipping and the update. `want_stop` is this rank's vote to stop after it.
StepResult train_step(Run& r, int64_t step, bool want_stop) {
  const Config& cfg = r.cfg;
  Tracer* tr = r.tracer && r.tracer->on(step) ? r.tracer.get() : nullptr;
  r.executor->set_trace(tr, step);
  if (r.ep.stats) *r.ep.stats = ExpertExchangeStats{tr, step};  // this step's all-to-alls
  auto span = [&](const char* name, const char* op, int track, int64_t begin) {
    if (tr) tr->add({name, op, track, step, -1, -1, begin, tr->mark()});
  };
  StepData data;
  const double t_in = now_s();
  const int64_t m_in = tr ? tr->mark() : 0;
  if (r.prefetcher) {
    const HostBatch& hb = r.prefetcher->next();
    data.inputs = hb.inputs.empty() ? nullptr : hb.inputs.data();
    data.tokens = hb.tokens.empty() ? nullptr : hb.tokens.data();
    data.class_targets = hb.class_targets.empty() ? nullptr : hb.class_targets.data();
    data.dense_targets = hb.dense_targets.empty() ? nullptr : hb.dense_targets.data();
    data.rows = hb.rows.empty() ? nullptr : hb.rows.data();
  }
  if (r.documents.on()) {  // the loss's denominator: counted targets over every replica
    // Each replica's count once (its cp ranks read the same sequences), summed over the dp x cp replicas.
    double counted = r.grid.cp_rank == 0
                         ? double(counted_targets(r.documents, data.tokens, r.replica_rows * r.layout.model.seq_len))
                         : 0.0;
    r.dp_comm->allreduce_host(&counted, 1, ReduceOp::sum, "the counted-targets reduction");
    data.counted_targets = int64_t(counted);
  }
  StepResult res;
  res.input_wait_s = now_s() - t_in;
  span("data", "data_wait", kTrackInput, m_in);
  res.stats = r.executor->run_step(data);
  const int64_t m_opt = tr ? tr->mark() : 0;
  // Gradient norm over every rank's share: all stages and tp shards of replica 0 (replicas hold equal
  // gradients after the all-reduce; an expert's, the first of the ranks holding it), or every rank's ZeRO shard; a
  // tied weight and a parameter replicated over tp count once.
  double sq = r.buckets->norm_share();
  const bool finite_here = std::isfinite(sq) && std::isfinite(res.stats.loss_sum);
  r.world->allreduce_host(&sq, 1, ReduceOp::sum, "the gradient-norm reduction");
  res.grad_norm = std::sqrt(sq);
  // The tp ranks of the last stage computed the same loss: count it once.
  double loss_sum = r.grid.tp_rank == 0 ? res.stats.loss_sum : 0.0;
  double flags[2] = {want_stop ? 1.0 : 0.0, finite_here ? 0.0 : 1.0};  // (stop vote, non-finite seen here)
  r.world->allreduce_host(&loss_sum, 1, ReduceOp::sum, "the loss reduction");
  r.world->allreduce_host(flags, 2, ReduceOp::max, "the stop-flag reduction");
  res.loss = loss_sum / (data.counted_targets > 0 ? double(data.counted_targets)
                                                 : double(cfg.train.batch_size) * double(r.layout.model.seq_len));
  res.loss += router_terms(r, res);
  if (r.ep.stats) {  // every rank has an ep group when parallel.ep > 1
    double t = r.ep.stats->seconds, rows = double(r.ep.stats->rows_sent);
    r.world->allreduce_host(&t, 1, ReduceOp::max, "the all-to-all time reduction");
    r.world->allreduce_host(&rows, 1, ReduceOp::sum, "the all-to-all rows reduction");
    res.ep_alltoall_s = t;
    res.ep_rows_sent = rows;
  }
  res.stop = flags[0] > 0;
  res.lr = learning_rate(cfg.lr_schedule, cfg.optimizer.lr, step, cfg.train.steps);
  // The same decision on every rank: a max-reduced flag, and sums every rank received alike.
  if (flags[1] > 0 || !std::isfinite(res.loss) || !std::isfinite(res.grad_norm)) {
    skip_nonfinite_step(r, step, res.loss, res.grad_norm);
    res.skipped = true;
    span("optimizer", "optimizer_step", kTrackCompute, m_opt);
    return res;
  }
  r.nonfinite_in_a_row = 0;
  const double clip = clip_factor(res.grad_norm, cfg.train.clip_grad_norm);
  if (clip < 1.0) r.buckets->scale(static_cast<float>(clip));
  r.optimizer->step(res.lr);
  r.buckets->gather_params();  // ZeRO: every replica's updated piece to every replica
  if (!r.expert_bias.empty()) update_expert_bias(r, res);
  span("optimizer", "optimizer_step", kTrackCompute, m_opt);  // norm, reductions, clipping, update
  if (r.verify_tied && !r.buckets->params_sharded()) verify_tied_copies(r, step);
  return res;
}

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

// Collective, after the first step and its evaluation if it has one (every buffer exists; evaluation runs in the
// training's buffers and allocates none of its own, which this report shows): each rank's measured bytes by
// kind beside the prediction `relay plan` makes, printed by rank 0 and written to <run.dir>/memory.json.
void report_memory(Run& r) {
  const ProcessGrid& g = r.grid;
  const MemoryBytes got = measured_memory(), want = predict_memory(r.cfg, r.layout, g.pp_rank, g.tp_rank);
  // The step's peak of parameter bytes (from setup's end): ZeRO-3's gathered blocks at their most.
  int64_t mine[10] = {got.params, got.grads, got.optimizer, got.activations,
                      want.params, want.grads, want.optimizer, want.activations, mem_peak_bytes(MemKind::params),
                      want.params + want.gathered};
  const std::vector<std::byte> bytes = r.world->gather_host(mine, sizeof mine, 0, nullptr, "the memory report");
  if (g.world_rank != 0) return;
  std::vector<int64_t> all(10 * static_cast<size_t>(g.world_size));  // (world_size x 10)
  std::memcpy(all.data(), bytes.data(), bytes.size());
  static const char* kinds[4] = {"params", "grads", "optimizer", "activations"};
  nlohmann::json ranks = nlohmann::json::array();
  std::string table = "relay: memory per rank after the first step, MiB measured (predicted by relay plan)\n"
                      "  rank              params          grads       optimizer     activations\n";
  for (int w = 0; w < g.world_size; ++w) {
    const int64_t* v = all.data() + 10 * static_cast<size_t>(w);
    const GridCoord c = grid_coord(w, g.dp, g.tp, g.cp);
    nlohmann::json j = {{"rank", w}, {"dp", c.dp_rank}, {"tp", c.tp_rank}, {"pp", c.pp_rank}, {"cp", c.cp_rank}};
    char row[160];
    std::snprintf(row, sizeof row, "  %4d", w);
    table += row;
    j["measured"]["peak_params"] = v[8];
    j["predicted"]["peak_params"] = v[9];
    for (int k = 0; k < 4; ++k) {
      j["measured"][kinds[k]] = v[k];
      j["predicted"][kinds[k]] = v[4 + k];
      std::snprintf(row, sizeof row, " %7s (%6s)", mib(v[k]).c_str(), mib(v[4 + k]).c_str());
      table += row;
    }
    table += "\n";
    ranks.push_back(j);
  }
  std::printf("%s", table.c_str());
  std::fflush(stdout);
  std::ofstream f(r.cfg.run.dir + "/memory.json", std::ios::trunc);
  f << nlohmann::json{{"bytes_per_rank", ranks}}.dump(1) << "\n";
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
  const int64_t kill_step = test_kill_step(g.world_rank);
  start_prefetcher(r);
  if (cfg.trace.on()) r.tracer = std::make_unique<Tracer>(*r.be, *r.world, cfg.trace.first, cfg.trace.last);
  CheckpointWriter writer(ckpt);  // after r: its destructor waits for a write in flight
  if (cfg.checkpoint.save_initial && r.start_step == 0) writer.save(0);

  const int64_t steps = cfg.train.steps;
  const double time_limit = cfg.train.time_limit.empty() ? 0 : parse_duration(cfg.train.time_limit, "train.time_limit");
  double last_ckpt_s = 0, window_t0 = now_s(), loop_t0 = now_s();
  // For the predicted-vs-measured table: the steps' wall time after the first (its warm-up left out), and the tensors'
  // bytes after the first step (before any evaluation's buffers).
  double steps_after_first_s = 0, memory_after_first = 0;
  int64_t window_steps = 0;
  // MFU on GPUs of the peak table (src/backend/gpu_peaks.cpp).
  const double peak_flops = r.be->device() == Device::cuda
                                ? gpu_peak_flops(r.be->describe(), cfg.train.precision) : 0.0;
  StepStats totals, window;
  double window_input_wait = 0;
  // Training FLOPs per sample: 6 x parameters per row, plus 3 x the attention's forward FLOPs (GPT-2:
  // 12 x n_layer x n_embd x T per token), from the layout's blocks.
  const double flops_per_sample =
      (6.0 * double(r.layout.param_count()) + 3.0 * r.layout.model.attention_flops_per_row()) *
      double(r.layout.model.seq_len);
  for (int64_t step = r.start_step + 1; step <= steps; ++step) {
    // Rank 0 decides the time limit; any rank's signal counts.
    const double avg_step = step > r.start_step + 1 ? (now_s() - loop_t0) / double(step - r.start_step - 1) : 0;
    // A stop writes a checkpoint, after the asynchronous one in flight if any.
    const double ckpt_s = last_ckpt_s * (writer.in_flight() ? 2 : 1);
    const bool out_of_time = rank0 && time_limit > 0 && now_s() - t_start + 2 * avg_step + 1.5 * ckpt_s >= time_limit;
    if (Watchdog* wd = active_watchdog()) wd->set_context(cat("step ", step));
    if (step == kill_step) {  // test only: a rank lost at the same step every run (or inside its next all-gather)
      if (test_kill_in_gather()) r.buckets->test_kill_in_next_gather();
      else std::raise(SIGKILL);
    }
    if (step == r.start_step + 2) r.be->op_profile_restart();  // RELAY_OP_PROFILE: from the second step on
    const double step_t0 = now_s();
    StepResult res = train_step(r, step, stop_requested() || out_of_time);
    if (step > r.start_step + 1) steps_after_first_s += now_s() - step_t0;
    writer.poll();  // checkpoint.async: a failed write ends every rank here
    totals.compute_s += res.stats.compute_s;
    totals.wait_s += res.stats.wait_s;
    totals.step_s += res.stats.step_s;
    window.compute_s += res.stats.compute_s;
    window.wait_s += res.stats.wait_s;
    window.pipeline_wait_s += res.stats.pipeline_wait_s;
    window.allreduce_wait_s += res.stats.allreduce_wait_s;
    window_input_wait += res.input_wait_s;
    ++window_steps;
    if (step % cfg.train.log_every == 0 || step == steps) {  // every rank: the memory reduction
      const double rss = resident_mib();
      double mem[2] = {rss, peak_resident_mib()};
      // Every rank's peak resident memory, for the record, and the largest of each.
      std::vector<double> peaks(rank0 ? static_cast<size_t>(g.world_size) : 0);  // (world_size)
      const std::vector<std::byte> got = r.world->gather_host(&mem[1], sizeof(double), 0, nullptr, "the memory report");
      if (rank0) std::memcpy(peaks.data(), got.data(), got.size());
      r.world->allreduce_host(mem, 2, ReduceOp::max, "the memory report");
      const WindowTimes times = stragglers.window(window.compute_s, window.wait_s, window_steps, step);
      if (rank0) {
        const double t = now_s(), per_s = double(window_steps * cfg.train.batch_size) / std::max(1e-9, t - window_t0);
        const double eta = (t - loop_t0) / double(step - r.start_step) * double(steps - step);
        StepRecord rec;
        rec.step = step;
        rec.loss = res.loss;
        rec.lr = res.lr;
        rec.grad_norm = res.grad_norm;
        rec.skipped_steps = step - r.optimizer->step_count();  // over the whole run: updates are counted
        rec.samples_per_s = per_s;
        rec.step_time_s = (t - window_t0) / double(std::max<int64_t>(1, window_steps));
        rec.elapsed_s = t - t_start;
        rec.eta_s = eta;
        rec.rss_mib = rss;
        rec.rss_max_mib = mem[0];
        rec.peak_rss_max_mib = mem[1];
        rec.peak_rss_mib_per_rank = peaks;
        rec.flops_per_s = flops_per_sample * per_s;
        if (peak_flops > 0) rec.mfu = rec.flops_per_s / (peak_flops * double(g.world_size));
        const double n = double(std::max<int64_t>(1, window_steps));
        rec.input_wait_s = window_input_wait / n;
        rec.pipeline_wait_s = window.pipeline_wait_s / n;
        rec.allreduce_wait_s = window.allreduce_wait_s / n;
        rec.slowest_rank = times.slowest_rank;
        rec.slowest_compute_s = times.slowest_compute_s;
        rec.median_compute_s = times.median_compute_s;
        rec.restarts = restart.count;
        rec.moe = !res.load_max.empty();
        rec.aux_loss = res.aux_loss;
        rec.z_loss = res.z_loss;
        rec.expert_load_max = res.load_max;
        rec.expert_load_mean = res.load_mean;
        rec.router_margin = res.margin;
        rec.ep_alltoall_s = res.ep_alltoall_s;
        rec.ep_rows_sent = res.ep_rows_sent;
        log->train(rec);
        window_t0 = t;
      }
      window_steps = 0;
      window = StepStats{};
      window_input_wait = 0;
    }
    Tracer* tr = r.tracer && r.tracer->on(step) ? r.tracer.get() : nullptr;
    if (r.eval_data.defined() && ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || step == steps)) {
      const int64_t m = tr ? tr->mark() : 0;
      EvalResult e = evaluate(r);
      if (tr) tr->add({"eval", "eval", kTrackCompute, step, -1, -1, m, tr->mark()});
      if (rank0) log->eval(step, e.loss, e.accuracy, r.layout.model.language_model || cfg.model.loss == "cross_entropy");
    }
    if (step == r.start_step + 1) {  // after the first step and its evaluation, before any checkpoint
      report_memory(r);
      memory_after_first = double(measured_memory().total());
    }
    const bool stop = res.stop && step < steps;
    if ((cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || step == steps || stop) {
      const double t = now_s();
      const int64_t m = tr ? tr->mark() : 0;
      writer.save(step);
      if (tr) tr->add({"checkpoint", "checkpoint", kTrackCompute, step, -1, -1, m, tr->mark()});
      last_ckpt_s = std::max(now_s() - t, writer.last_duration_s());  // an async write must end in time too
    }
    if (stop) {
      writer.finish();
      if (rank0) {
        std::printf("relay: stopping at step %lld on %s; checkpoint written, exit code %d (resumable)\n",
                    static_cast<long long>(step),
                    stop_signal() ? cat("signal ", stop_signal()).c_str() : "train.time_limit", kExitResumable);
        std::fflush(stdout);
      }
      stragglers.report(totals.compute_s, totals.wait_s, step - r.start_step);
      write_trace(r);
      teardown(r);
      return kExitResumable;
    }
  }
  writer.finish();
  const int64_t stat_steps = steps - r.start_step;
  if (rank0 && stat_steps > 0)
    std::printf("relay: done. rank 0 per step: compute %.4f s, waiting %.4f s (%.1f%% idle; simulated bubble %.1f%%)\n",
                totals.compute_s / double(stat_steps), totals.wait_s / double(stat_steps),
                100.0 * totals.wait_s / std::max(1e-12, totals.step_s), 100.0 * r.predicted_bubble);
  if (rank0 && plan.on() && stat_steps > 1)
    compare_with_plan(plan, steps_after_first_s / double(stat_steps - 1), totals.compute_s / double(stat_steps),
                      totals.wait_s / double(stat_steps), memory_after_first);
  if (rank0) std::printf("relay: results in %s (metrics.jsonl, config.toml, checkpoints/)\n", cfg.run.dir.c_str());
  std::fflush(stdout);
  // Per-rank idle time for benchmarks: RELAY_STAGE_STATS=1 prints every rank's measured wait.
  if (std::getenv("RELAY_STAGE_STATS") && stat_steps > 0) {
    std::printf("stage-stats rank %d pp_rank %d dp_rank %d compute_s %.6f wait_s %.6f step_s %.6f\n", g.world_rank,
                g.pp_rank, g.dp_rank, totals.compute_s / double(stat_steps), totals.wait_s / double(stat_steps),
                totals.step_s / double(stat_steps));
    std::fflush(stdout);
  }
  stragglers.report(totals.compute_s, totals.wait_s, stat_steps);
  write_trace(r);
  teardown(r);
  return 0;
}

}  // namespace relay
