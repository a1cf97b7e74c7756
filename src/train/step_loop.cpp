// The step loop (train/step_loop.hpp): one optimizer step (train_step: the batch, the schedule, the reductions, the
// update) and what is due after it.
#include "train/step_loop.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/gpu_peaks.hpp"
#include "comm/agree.hpp"
#include "comm/watchdog.hpp"
#include "core/memory.hpp"
#include "core/test_faults.hpp"
#include "model/block_cost.hpp"
#include "train/memory_plan.hpp"
#include "train/restarts.hpp"
#include "train/signals.hpp"

namespace relay {

namespace {

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
  int stop_signal = 0;  // the signal that asked it (the largest number any rank saw), 0: the time limit
  bool skipped = false;  // a non-finite loss or gradient norm: no update (train.skip_nonfinite)
  StepStats stats;
  // MoE models: the means of the load-balancing and z losses (model/moe.hpp; in `loss` with their coefficients) and
  // each MoE layer's largest and mean token count per expert over the global batch.
  double aux_loss = 0, z_loss = 0, margin = INFINITY;
  std::vector<double> load_max, load_mean;
  std::vector<double> tokens;  // (MoE layers, n_experts) tokens routed to each expert over the global batch
  double ep_alltoall_s = -1, ep_rows_sent = 0;  // parallel.ep: the slowest rank's all-to-all time; rows sent away
  std::vector<double> mtp_losses;  // multi-token prediction: each module's CE_k over the global batch
  double mtp_loss = 0;             // their mean
};

// model.num_mtp_layers: the multi-token prediction block's depth D (0 without one).
int64_t mtp_depth(const Run& r) {
  int64_t D = 0;
  for (const BlockSpec& b : r.layout.model.blocks)
    if (b.kind == BlockKind::mtp) D = b.mtp.depth;
  return D;
}

// Multi-token prediction: the positions each module k counts over the global batch (model/documents.hpp), the same
// on every rank: batch x (T - k), or with a document mask each replica's count once (its cp ranks read the same
// sequences) summed over the dp x cp replicas, as the main loss's counted targets are.
std::vector<int64_t> mtp_counted(Run& r, const StepData& data) {
  const int64_t D = mtp_depth(r), T = r.layout.model.seq_len;
  std::vector<double> n(size_t(D), 0.0);
  for (int64_t k = 1; k <= D; ++k)
    if (!r.documents.on())
      n[size_t(k - 1)] = double(r.cfg.train.batch_size * std::max<int64_t>(T - k, 0));
    else if (r.grid.cp_rank == 0)
      n[size_t(k - 1)] = double(counted_mtp_targets(r.documents, data.tokens, r.replica_rows * T, T, k));
  if (D > 0 && r.documents.on())
    r.dp_comm->allreduce_host(n.data(), int(D), ReduceOp::sum, "the MTP counted-targets reduction");
  return std::vector<int64_t>(n.begin(), n.end());
}

// Multi-token prediction (model/mtp_block.cpp): each module's CE sums over every rank (the tp ranks of the last stage
// computed the same: tp rank 0's), as the means over the global batch's counted positions of each depth, into res.
void mtp_terms(Run& r, const StepData& data, StepResult& res) {
  const int64_t D = mtp_depth(r);
  if (D == 0) return;
  std::vector<double> sums(size_t(D), 0.0);
  if (r.grid.tp_rank == 0)
    for (size_t k = 0; k < res.stats.mtp.size(); ++k) sums[k] += res.stats.mtp[k];
  r.world->allreduce_host(sums.data(), int(D), ReduceOp::sum, "the multi-token prediction loss reduction");
  res.mtp_loss = 0;
  for (int64_t k = 1; k <= D; ++k) {
    const double counted = double(data.mtp_counted[size_t(k - 1)]);
    res.mtp_losses.push_back(counted > 0 ? sums[size_t(k - 1)] / counted : 0.0);
    res.mtp_loss += res.mtp_losses.back() / double(D);
  }
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
// loss and gradient norm, clipping and the update. `stop_vote` is this rank's vote to stop after it: the number of the
// signal it received, 0.5 for the time limit, 0 to go on (max-reduced, so every rank knows which signal asked, also
// a rank the signal never reached: rank 0 names it in the log).
StepResult train_step(Run& r, int64_t step, double stop_vote) {
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
  data.mtp_counted = mtp_counted(r, data);
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
  double flags[2] = {stop_vote, finite_here ? 0.0 : 1.0};  // (stop vote, non-finite seen here)
  r.world->allreduce_host(&loss_sum, 1, ReduceOp::sum, "the loss reduction");
  r.world->allreduce_host(flags, 2, ReduceOp::max, "the stop-flag reduction");
  res.loss = loss_sum / (data.counted_targets > 0 ? double(data.counted_targets)
                                                 : double(cfg.train.batch_size) * double(r.layout.model.seq_len));
  res.loss += router_terms(r, res);
  mtp_terms(r, data, res);
  if (r.ep.stats) {  // every rank has an ep group when parallel.ep > 1
    double t = r.ep.stats->seconds, rows = double(r.ep.stats->rows_sent);
    r.world->allreduce_host(&t, 1, ReduceOp::max, "the all-to-all time reduction");
    r.world->allreduce_host(&rows, 1, ReduceOp::sum, "the all-to-all rows reduction");
    res.ep_alltoall_s = t;
    res.ep_rows_sent = rows;
  }
  res.stop = flags[0] > 0;
  res.stop_signal = flags[0] >= 1 ? int(flags[0]) : 0;
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
  // ZeRO-1/2 with overlap: bucket by bucket, each bucket's parameter all-gather issued as soon as it is updated;
  // otherwise one update, then gather_params (ZeRO: every replica's updated piece to every replica).
  const std::optional<UpdateGroups> groups = r.buckets->update_groups();
  r.optimizer->step(res.lr, groups ? &*groups : nullptr);
  for (auto& [name, p] : r.params) p->weights_changed();  // FP8: the weights' cached codes are the last step's
  if (!groups) r.buckets->gather_params();  // (overlap: issued only)
  if (!r.expert_bias.empty() || r.verify_tied) r.buckets->settle_params();  // (these read the parameters)
  if (!r.expert_bias.empty()) update_expert_bias(r, res);
  span("optimizer", "optimizer_step", kTrackCompute, m_opt);  // norm, reductions, clipping, update
  if (r.verify_tied && !r.buckets->params_sharded()) verify_tied_copies(r, step);
  return res;
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

// The steps since the last logged one (every rank's, for the reductions; rank 0 logs).
struct Window {
  StepStats stats;
  double input_wait_s = 0;
  int64_t steps = 0;
  double t0 = now_s();
};

// Collective, every train.log_every steps and at the last: every rank's memory and compute times reduced, and rank 0's
// metrics.jsonl record of the window (loss, rates, MFU on GPUs, waits, stragglers, the routers).
void log_window(Run& r, LoopSetup& s, int64_t step, const StepResult& res, Window& w, double loop_t0) {
  const Config& cfg = r.cfg;
  const ProcessGrid& g = r.grid;
  const bool rank0 = g.world_rank == 0;
  const double rss = resident_mib();
  double mem[2] = {rss, peak_resident_mib()};
  // Every rank's peak resident memory, for the record, and the largest of each.
  std::vector<double> peaks(rank0 ? static_cast<size_t>(g.world_size) : 0);  // (world_size)
  const std::vector<std::byte> got = r.world->gather_host(&mem[1], sizeof(double), 0, nullptr, "the memory report");
  if (rank0) std::memcpy(peaks.data(), got.data(), got.size());
  r.world->allreduce_host(mem, 2, ReduceOp::max, "the memory report");
  const WindowTimes times = s.stragglers.window(w.stats.compute_s, w.stats.wait_s, w.steps, step);
  const double t = now_s();
  if (rank0) {
    // MFU on GPUs of the peak table (src/backend/gpu_peaks.cpp).
    const double peak_flops = r.be->device() == Device::cuda
                                  ? gpu_peak_flops(r.be->describe(), cfg.train.precision) : 0.0;
    // Training FLOPs per sample: the model FLOPs per row `relay plan` counts for its MFU (model/block_cost.hpp: 3 x
    // the blocks' forward, attention included, a MoE layer's k active experts only) x rows per sample.
    const double flops_per_sample = model_flops_per_row(r.layout.model) * double(r.layout.model.seq_len);
    const double per_s = double(w.steps * cfg.train.batch_size) / std::max(1e-9, t - w.t0);
    const double eta = (t - loop_t0) / double(step - r.start_step) * double(cfg.train.steps - step);
    const double n = double(std::max<int64_t>(1, w.steps));
    StepRecord rec;
    rec.step = step;
    rec.loss = res.loss;
    rec.lr = res.lr;
    rec.grad_norm = res.grad_norm;
    rec.skipped_steps = step - r.optimizer->step_count();  // over the whole run: updates are counted
    rec.samples_per_s = per_s;
    rec.step_time_s = (t - w.t0) / n;
    rec.elapsed_s = t - s.t_start;
    rec.eta_s = eta;
    rec.rss_mib = rss;
    rec.rss_max_mib = mem[0];
    rec.peak_rss_max_mib = mem[1];
    rec.peak_rss_mib_per_rank = peaks;
    rec.flops_per_s = flops_per_sample * per_s;
    if (peak_flops > 0) rec.mfu = rec.flops_per_s / (peak_flops * double(g.world_size));
    rec.input_wait_s = w.input_wait_s / n;
    rec.pipeline_wait_s = w.stats.pipeline_wait_s / n;
    rec.allreduce_wait_s = w.stats.allreduce_wait_s / n;
    rec.exposed_comm_s = w.stats.exposed_comm_s / n;
    rec.slowest_rank = times.slowest_rank;
    rec.slowest_compute_s = times.slowest_compute_s;
    rec.median_compute_s = times.median_compute_s;
    rec.restarts = s.restarts;
    rec.moe = !res.load_max.empty();
    rec.aux_loss = res.aux_loss;
    rec.z_loss = res.z_loss;
    rec.expert_load_max = res.load_max;
    rec.expert_load_mean = res.load_mean;
    rec.router_margin = res.margin;
    rec.mtp_losses = res.mtp_losses;
    rec.mtp_loss = res.mtp_loss;
    rec.ep_alltoall_s = res.ep_alltoall_s;
    rec.ep_rows_sent = res.ep_rows_sent;
    s.log->train(rec);
  }
  w = Window{};
  w.t0 = t;
}

}  // namespace

void push_expert_bias(Run& r) {
  for (auto& ch : r.chunks)
    for (const auto& b : ch->blocks()) b->set_expert_bias(*r.be, r.expert_bias);
}

LoopOutcome run_steps(Run& r, LoopSetup& s) {
  const Config& cfg = r.cfg;
  const bool rank0 = r.grid.world_rank == 0;
  const int64_t steps = cfg.train.steps;
  const int64_t kill_step = test_kill_step(r.grid.world_rank);
  const double time_limit = cfg.train.time_limit.empty() ? 0 : parse_duration(cfg.train.time_limit, "train.time_limit");
  const double loop_t0 = now_s();
  double last_ckpt_s = 0;
  LoopOutcome out;
  Window w;
  for (int64_t step = r.start_step + 1; step <= steps; ++step) {
    // Rank 0 decides the time limit; any rank's signal counts.
    const double avg_step = step > r.start_step + 1 ? (now_s() - loop_t0) / double(step - r.start_step - 1) : 0;
    // A stop writes a checkpoint, after the asynchronous one in flight if any.
    const double ckpt_s = last_ckpt_s * (s.writer.in_flight() ? 2 : 1);
    const bool out_of_time = rank0 && time_limit > 0 && now_s() - s.t_start + 2 * avg_step + 1.5 * ckpt_s >= time_limit;
    if (Watchdog* wd = active_watchdog()) wd->set_context(cat("step ", step));
    if (step == kill_step) {  // test only: a rank lost at the same step every run (or inside its next all-gather)
      if (test_kill_in_gather()) r.buckets->test_kill_in_next_gather();
      else if (!arm_test_fault()) std::raise(SIGKILL);  // or a signal inside a named collective
    }
    if (step == r.start_step + 2) r.be->op_profile_restart();  // RELAY_OP_PROFILE: from the second step on
    const double step_t0 = now_s();
    const int sig = stop_signal();  // read once: a signal may arrive at any time
    StepResult res = train_step(r, step, sig > 0 ? double(sig) : out_of_time ? 0.5 : 0.0);
    res.stats.exposed_comm_s = r.buckets->take_waited_s();  // the step's, the ZeRO all-gather after the update included
    if (r.cp.attention) res.stats.exposed_comm_s += r.cp.attention->take_waited_s();  // cp's key/value exchanges
    if (r.ep.stats) res.stats.exposed_comm_s += r.ep.stats->seconds;  // ep's all-to-alls (their waits, with overlap)
    res.stats.exposed_comm_s += r.tp.take_waited_s();  // tp's (and sequence parallelism's) collectives
    if (step > r.start_step + 1) out.steps_after_first_s += now_s() - step_t0;
    s.writer.poll();  // checkpoint.async: a failed write ends every rank here
    out.last_step = step;
    out.totals.compute_s += res.stats.compute_s;
    out.totals.wait_s += res.stats.wait_s;
    out.totals.step_s += res.stats.step_s;
    out.totals.exposed_comm_s += res.stats.exposed_comm_s;
    w.stats.compute_s += res.stats.compute_s;
    w.stats.wait_s += res.stats.wait_s;
    w.stats.pipeline_wait_s += res.stats.pipeline_wait_s;
    w.stats.allreduce_wait_s += res.stats.allreduce_wait_s;
    w.stats.exposed_comm_s += res.stats.exposed_comm_s;
    w.input_wait_s += res.input_wait_s;
    ++w.steps;
    if (step % cfg.train.log_every == 0 || step == steps) log_window(r, s, step, res, w, loop_t0);
    Tracer* tr = r.tracer && r.tracer->on(step) ? r.tracer.get() : nullptr;
    const bool eval_now =
        r.eval_data.defined() && ((cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0) || step == steps);
    const bool stop = res.stop && step < steps;
    const bool save_now = (cfg.checkpoint.every > 0 && step % cfg.checkpoint.every == 0) || step == steps || stop;
    // parallel.overlap: ZeRO's parameter all-gathers are still in flight unless the next forward comes first.
    if (eval_now || save_now) r.buckets->settle_params();
    if (eval_now) {
      const int64_t m = tr ? tr->mark() : 0;
      EvalResult e = evaluate(r);
      r.buckets->release_kept();  // (ZeRO-3: no backward follows the evaluation's forward)
      if (tr) tr->add({"eval", "eval", kTrackCompute, step, -1, -1, m, tr->mark()});
      if (rank0) s.log->eval(step, e.loss, e.accuracy, r.layout.model.language_model || cfg.model.loss == "cross_entropy");
    }
    if (step == r.start_step + 1) {  // after the first step and its evaluation, before any checkpoint
      report_memory(r);
      out.memory_after_first = double(measured_memory().total());
    }
    if (save_now) {
      const double t = now_s();
      const int64_t m = tr ? tr->mark() : 0;
      s.writer.save(step);
      if (tr) tr->add({"checkpoint", "checkpoint", kTrackCompute, step, -1, -1, m, tr->mark()});
      last_ckpt_s = std::max(now_s() - t, s.writer.last_duration_s());  // an async write must end in time too
    }
    if (stop) {
      out.stopped = true;
      out.stop_signal = res.stop_signal;
      return out;
    }
  }
  r.buckets->settle_params();
  return out;
}

}  // namespace relay
