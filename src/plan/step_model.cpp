#include "plan/step_model.hpp"

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <map>

#include "model/block_cost.hpp"
#include "model/expert_parallel.hpp"
#include "model/tensor_parallel.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/sharding.hpp"
#include "parallel/simulator.hpp"
#include "plan/collectives.hpp"
#include "plan/cost_model.hpp"
#include "train/memory_plan.hpp"
#include "train/model_layout.hpp"

namespace relay {

std::string describe_layout(const Config& cfg) {
  const auto& p = cfg.parallel;
  std::string s = cat("dp ", p.dp, ", tp ", p.tp);
  if (p.tp > 1 && p.sequence_parallel) s += " (sp)";
  if (p.cp > 1) s += cat(", cp ", p.cp);
  if (p.ep > 1) s += cat(", ep ", p.ep);
  s += cat(", pp ", p.pp);
  if (p.pp > 1) s += cat(" (", p.schedule, p.virtual_stages > 1 ? cat(" v", p.virtual_stages) : "", ")");
  s += cat(", mbs ", micro_batch_rows(cfg), " x ", cfg.train.micro_batches);
  if (cfg.optimizer.zero) s += cat(", ZeRO-", cfg.optimizer.zero);
  if (cfg.train.recompute == "blocks") s += ", recompute";
  return s;
}

namespace {

// Where the blocks run: the rows of a micro-batch on a rank, the tp / cp / ep groups and their paths, and the groups
// the data-parallel moves span.
struct Groups {
  BlockContext ctx;
  GroupPath dp_path;   // the replicas ZeRO and the gradient sums span (dp x cp)
  GroupPath edp_path;  // under ep, an expert's copies: the dp x cp / ep ranks holding the same experts
};

Groups step_groups(const Cluster& cl, const Config& cfg, int64_t T, PlannedKernels kernels) {
  const int tp = int(cfg.parallel.tp), cp = int(cfg.parallel.cp), dp = int(cfg.parallel.dp), ep = int(cfg.parallel.ep);
  Groups g;
  BlockContext& ctx = g.ctx;
  ctx.rows = micro_batch_rows(cfg) * T / cp;
  ctx.tp = tp;
  ctx.cp = cp;
  ctx.sequence_parallel = cfg.parallel.sequence_parallel;
  ctx.recompute = cfg.train.recompute == "blocks";
  ctx.precision = cfg.train.precision;
  // ZeRO-3 keeps no FP8 codes of the weights it gathers (parallel/data_parallel.cpp): quantised in every use there.
  ctx.fp8_weights_cached = cfg.train.precision == Precision::fp8 && cfg.optimizer.zero < 3;
  ctx.attention = kernels.attention;
  ctx.elementwise = kernels.elementwise;
  ctx.overlap = cfg.parallel.overlap;
  ctx.tp_overlap = tp_overlaps(cfg.parallel.overlap, cl.device.backend);
  ctx.ep_overlap = ep_overlaps(cfg.parallel.overlap, ep, cl.device.backend);
  ctx.split_backward = cfg.parallel.schedule == "zb-h1";
  ctx.tp_path = group_path(cl, tp, 1);
  ctx.cp_path = group_path(cl, cp, tp);
  ctx.ep = ep;
  ctx.ep_path = group_path(cl, ep, tp * cp);  // ep consecutive dp ranks
  g.dp_path = group_path(cl, dp * cp, tp);
  g.edp_path = group_path(cl, dp * cp / ep, tp * cp * ep);  // one in each ep group
  return g;
}

// The data-parallel moves of the layout's ZeRO stage (parallel/sharding.hpp), priced on their groups: the dense
// weights' over the replicas (dp_path), the experts' over their copies (edp_path). Sums those issued at `when` for
// `params` dense and `experts` expert elements, the dense ones first.
double dp_comm_s(const Sharding& sharding, const Groups& g, double params, double experts,
                 std::initializer_list<Issued> when) {
  double s = 0;
  for (const Move& m : sharding.moves) {
    if (std::find(when.begin(), when.end(), m.issued) == when.end()) continue;
    const bool dense = m.group == GradGroup::dense;
    const GroupPath& path = dense ? g.dp_path : g.edp_path;
    const double bytes = double(dtype_size(m.dtype)) * (dense ? params : experts);
    s += m.collective == Collective::all_reduce       ? all_reduce_s(path, bytes)
         : m.collective == Collective::reduce_scatter ? reduce_scatter_s(path, bytes)
                                                      : all_gather_s(path, bytes);
  }
  return s;
}

// Per chunk: the simulator's F, B, W (seconds), and what the chunk's parameters weigh on a tp rank.
struct ChunkCosts {
  Costs costs;
  std::vector<double> comm, ep_comm;  // (chunks) tp / cp / ep collectives per micro-batch; of which ep's all-to-alls
  std::vector<double> cp_hidden;      // (chunks) per micro-batch: cp gathers hidden behind attention (parallel.overlap)
  std::vector<double> ep_hidden;      // (chunks) per micro-batch: ep all-to-alls hidden behind experts (parallel.overlap)
  std::vector<double> tp_hidden;      // (chunks) per micro-batch: tp all-reduces hidden behind weight gradients
  std::vector<double> fp8_weights;    // (chunks) per optimizer step: the weights' cached FP8 codes made
  std::vector<double> zero_exposed;   // (chunks) per micro-batch: ZeRO-2/3's per-block moves the blocks wait for
  std::vector<double> zero_drain;     // (chunks) once a step: its last reduce-scatters, waited for after the backward
  // (chunks) the chunk's dense parameters on a tp rank (every parameter at ep 1); under ep > 1, the rank's experts'
  // (1 / ep of them), summed over edp_path instead of dp_path.
  std::vector<double> params, experts;
  // (chunks) each chunk's blocks in block order: what parallel.overlap's per-bucket moves need.
  struct Block {
    double forward, backward;  // seconds per micro-batch (the backward: input and weight gradients)
    double params, experts;    // as above, this block's
  };
  std::vector<std::vector<Block>> blocks;
};

}  // namespace

ZeroWaits zero_block_waits(const std::vector<BlockMoves>& blocks) {
  ZeroWaits w;
  const size_t n = blocks.size();
  double t = 0, link = 0, moved_f = 0, moved_b = 0;
  std::vector<double> ready(n, -1);  // (blocks) when the block's gather is done; -1: not issued
  auto issue = [&](size_t k, double at, double seconds) {
    link = std::max(at, link) + seconds;
    ready[k] = link;
  };
  auto run = [&](size_t k, double compute, size_t next, bool has_next, double BlockMoves::*gather, double& wait) {
    const BlockMoves& b = blocks[k];
    if (!b.hooks) {
      t += compute;
      return;
    }
    if (ready[k] < 0) issue(k, t, b.*gather);
    const double start = std::max(t, ready[k]);
    wait += start - t;
    if (has_next && blocks[next].hooks && ready[next] < 0) issue(next, start, blocks[next].*gather);
    t = start + compute;
  };
  for (size_t k = 0; k < n; ++k) {
    run(k, blocks[k].forward, k + 1, k + 1 < n, &BlockMoves::gather_f, w.forward);
    moved_f += blocks[k].gather_f;
  }
  std::fill(ready.begin(), ready.end(), -1.0);
  std::deque<double> flight;  // the reduce-scatters in flight: when each is done
  auto reclaim = [&](double& wait) {
    const double done = flight.front();
    flight.pop_front();
    if (done > t) {
      wait += done - t;
      t = done;
    }
  };
  for (size_t k = n; k-- > 0;) {
    run(k, blocks[k].backward, k - 1, k > 0, &BlockMoves::gather_b, w.backward);
    moved_b += blocks[k].gather_b + blocks[k].reduce_scatter;
    if (blocks[k].reduce_scatter <= 0) continue;
    link = std::max(t, link) + blocks[k].reduce_scatter;
    flight.push_back(link);
    while (flight.size() > Zero2Pool::kInFlight) reclaim(w.backward);
  }
  while (!flight.empty()) reclaim(w.drain);
  w.hidden_forward = std::max(0.0, moved_f - w.forward);
  w.hidden_backward = std::max(0.0, moved_b - w.backward - w.drain);
  return w;
}

namespace {

// moves_progress: whether ZeRO-2/3's per-block moves travel while the blocks compute (parallel.overlap's progress
// thread, or a communicator that progresses alone: Cluster::async_progress); otherwise each waits in full.
ChunkCosts chunk_costs(const Cluster::Device& dev, const ModelLayout& layout, const Groups& g, const Sharding& sharding,
                       int tp, int ep, int pp, bool moves_progress) {
  const size_t chunks = size_t(layout.num_chunks());
  ChunkCosts cc;
  Costs& costs = cc.costs;
  costs.chunk_forward.assign(chunks, 0);
  costs.chunk_backward_input = costs.chunk_backward_weight = costs.chunk_forward;
  cc.comm.assign(chunks, 0);
  cc.ep_comm = cc.params = cc.experts = cc.cp_hidden = cc.ep_hidden = cc.tp_hidden = cc.fp8_weights = cc.zero_exposed =
      cc.zero_drain = cc.comm;
  cc.blocks.resize(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const ChunkRange& cr = layout.chunks[c];
    double prev_compute = 0;
    std::vector<BlockMoves> moves;  // (blocks) on one stage with progress: timed by zero_block_waits below
    int last_with_params = -1;      // its parameters stay gathered from its forward into its backward (one stage)
    for (int i = cr.begin; i < cr.end; ++i)
      if (!layout.blocks()[size_t(i)].params.empty()) last_with_params = i;
    for (int i = cr.begin; i < cr.end; ++i) {
      const BlockSpec& b = layout.blocks()[size_t(i)];
      const BlockTime t = block_time(dev, b, g.ctx);
      double params = 0, experts = 0;
      for (size_t j = 0; j < b.params.size(); ++j) {
        const ParamSpec& p = b.params[j];
        const double n = double(shape_numel(p.shape)) / (p.split.replicated() ? 1 : tp);
        if (ep > 1 && expert_of_param(b, j) >= 0) experts += n / ep;
        else params += n;
      }
      cc.params[c] += params;
      cc.experts[c] += experts;
      cc.blocks[c].push_back({t.forward, t.backward_input + t.backward_weight, params, experts});
      double f = t.forward, bi = t.backward_input, bw = t.backward_weight;
      // ZeRO-2/3: each micro-batch's gradient buckets are reduce-scattered as the backward finishes their blocks;
      // ZeRO-3 on one stage also gathers each block's parameters for its forward and again for its backward
      // (parallel.reshard_after_forward; once, kept, otherwise: priced in every micro-batch's forward, an upper bound).
      // ZeRO-3 under pp > 1 reduce-scatters once, at allreduce_grads (priced below), yet this model has also priced
      // a reduce-scatter per block in its backward since before parallel/sharding.hpp: kept, so that the predictions
      // stay what they were.
      const bool step_buckets = sharding.group(GradGroup::dense).grads == GradHold::step_buckets;
      const double bucket_rs =
          dp_comm_s(sharding, g, params, experts, {step_buckets ? Issued::allreduce_grads : Issued::bucket_done});
      const double gather_f =
          pp == 1 ? dp_comm_s(sharding, g, params, experts, {Issued::block_run, Issued::block_first_run}) : 0;
      // The stage's last block with parameters keeps them from its forward into its backward (GradBuckets::kept_).
      const double gather_b =
          pp == 1 && i != last_with_params ? dp_comm_s(sharding, g, params, experts, {Issued::block_run}) : 0;
      if (pp == 1 && moves_progress) {  // timed below, block after block, as the blocks run them
        moves.push_back({f, bi + bw, gather_f, gather_b, bucket_rs, !b.params.empty()});
      } else {
        // Each block's moves hidden behind the block before (the gather) and its own backward (the reduce-scatter)
        // unless the collective is the longer; without progress nothing hides: the gather is waited for before the
        // block, the reduce-scatter after it. What hides costs the compute its share (Link::overlap_compute_share).
        // (Under parallel.reshard_after_forward = false the backward's gather is priced as the forward's: an upper
        // bound, as before.)
        const double gather = gather_f, again = i == last_with_params ? gather_b : gather;
        const double hidden_f = moves_progress ? std::min(gather, prev_compute) : 0,
                     hidden_b = moves_progress ? std::min(bucket_rs + again, t.backward_input + t.backward_weight) : 0;
        f += gather - hidden_f + g.dp_path.compute_share * hidden_f;
        bw += bucket_rs + again - hidden_b + g.dp_path.compute_share * hidden_b;
        cc.zero_exposed[c] += gather - hidden_f + bucket_rs + again - hidden_b;
      }
      prev_compute = t.forward - t.comm_forward;
      costs.chunk_forward[c] += f;
      costs.chunk_backward_input[c] += bi;
      costs.chunk_backward_weight[c] += bw;
      cc.comm[c] += t.comm_forward + t.comm_backward;
      cc.ep_comm[c] += t.ep_forward + t.ep_backward;
      cc.cp_hidden[c] += t.cp_hidden;
      cc.ep_hidden[c] += t.ep_hidden;
      cc.tp_hidden[c] += t.tp_hidden;
      cc.fp8_weights[c] += t.fp8_weights;
    }
    if (moves.empty()) continue;
    const ZeroWaits w = zero_block_waits(moves);
    costs.chunk_forward[c] += w.forward + g.dp_path.compute_share * w.hidden_forward;
    costs.chunk_backward_weight[c] += w.backward + g.dp_path.compute_share * w.hidden_backward;
    cc.zero_exposed[c] += w.forward + w.backward;
    cc.zero_drain[c] = w.drain;
  }
  return cc;
}

// The reductions a step issues once (allreduce_grads), as Relay issues them: with parallel.overlap each block's buckets
// start as the last micro-batch's backward finishes the block (DDP's rule; `last` is that backward, the chunk's blocks
// taking their share of it in reverse block order), otherwise the whole chunk's at the end of `last`. They run one
// after another from comm_free; returns when the last is done.
// `hidden` gains the seconds of them that ran before `last` ended (behind the compute).
double reduce_chunk(const Groups& g, const Sharding& sharding, const ChunkCosts& cc, int c, const TimedAction& last,
                    bool overlap, double comm_free, double& hidden) {
  const auto& blocks = cc.blocks[size_t(c)];
  if (!overlap) {
    const double reduce = dp_comm_s(sharding, g, cc.params[size_t(c)], cc.experts[size_t(c)], {Issued::allreduce_grads});
    return reduce > 0 ? std::max(comm_free, last.end) + reduce : comm_free;
  }
  double total = 0;
  for (const auto& b : blocks) total += b.backward;
  double done = 0;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    done += it->backward;
    const double ready = last.start + (total > 0 ? done / total : 1.0) * (last.end - last.start);
    const double reduce = dp_comm_s(sharding, g, it->params, it->experts, {Issued::allreduce_grads});
    if (reduce <= 0) continue;
    const double start = std::max(comm_free, ready);
    comm_free = start + reduce;
    hidden += std::max(0.0, std::min(comm_free, last.end) - start);
  }
  return comm_free;
}

// ZeRO-1/2's parameter all-gather after the optimizer: without parallel.overlap all of it before the next step; with
// it, issued block after block in the order the next forward reads them (parallel/data_parallel.cpp gather_params) and
// waited for where the forward first reads a block. `first_forward` (chunks): when the rank's first forward of each
// chunk starts in the step. Returns the seconds the step waits.
// `hidden` gains the seconds of the gather that ran behind the forward.
double param_gather_exposed(const Groups& g, const Sharding& sharding, const ChunkCosts& cc,
                            const std::map<int, double>& first_forward, bool overlap, double params, double experts,
                            double& hidden) {
  if (!overlap) return dp_comm_s(sharding, g, params, experts, {Issued::after_optimizer});
  double arrived = 0, exposed = 0;
  for (const auto& [c, start] : first_forward) {
    double need = start;
    for (const auto& b : cc.blocks[size_t(c)]) {
      arrived += dp_comm_s(sharding, g, b.params, b.experts, {Issued::after_optimizer});
      exposed = std::max(exposed, arrived - need);
      need += b.forward;
    }
  }
  hidden += arrived - exposed;
  return exposed;
}

// After the simulated compute: each rank's data-parallel reductions (reduce_chunk), then the optimizer and (ZeRO-1/2)
// the parameter all-gather. The slowest rank sets the step and the breakdown in r.
void rank_steps(const Cluster::Device& dev, const Groups& g, const Sharding& sharding, const ChunkCosts& cc,
                const ScheduleShape& shape, const SimResult& sim, bool mixed, bool overlap, StepPrediction& r) {
  const int pp = shape.pp;
  double step = 0;
  for (int rank = 0; rank < pp; ++rank) {
    std::map<int, TimedAction> last_w;  // chunk -> its last backward (the one writing its weight gradients)
    std::map<int, double> first_f;      // chunk -> the start of its first forward
    double end = 0, comm_free = 0, busy = 0, params = 0, experts = 0, comm = 0, ep_comm = 0, cp_hidden = 0,
           ep_hidden = 0, tp_hidden = 0, fp8_weights = 0, zero_exposed = 0, zero_drain = 0, dp_hidden = 0;
    for (const TimedAction& a : sim.timeline[size_t(rank)]) {
      end = std::max(end, a.end);
      busy += a.end - a.start;
      const int c = a.action.chunk;
      if (a.action.op == Op::backward || a.action.op == Op::backward_weight)
        if (!last_w.count(c) || a.end > last_w.at(c).end) last_w.insert_or_assign(c, a);
      if (a.action.op == Op::forward && (!first_f.count(c) || a.start < first_f.at(c))) first_f[c] = a.start;
    }
    std::vector<std::pair<double, int>> order;
    for (auto& [c, a] : last_w) order.push_back({a.end, c});
    std::sort(order.begin(), order.end());
    for (auto& [t, c] : order) {
      params += cc.params[size_t(c)];
      experts += cc.experts[size_t(c)];
      comm += cc.comm[size_t(c)] * shape.m;
      ep_comm += cc.ep_comm[size_t(c)] * shape.m;
      cp_hidden += cc.cp_hidden[size_t(c)] * shape.m;
      ep_hidden += cc.ep_hidden[size_t(c)] * shape.m;
      tp_hidden += cc.tp_hidden[size_t(c)] * shape.m;
      fp8_weights += cc.fp8_weights[size_t(c)];  // once a step, whatever the micro-batches
      zero_exposed += cc.zero_exposed[size_t(c)] * shape.m;
      zero_drain += cc.zero_drain[size_t(c)];  // once a step, after the last micro-batch's backward
      // Dense buckets over every replica, then (ep > 1) the experts' over their copies.
      comm_free = reduce_chunk(g, sharding, cc, c, last_w.at(c), overlap, comm_free, dp_hidden);
    }
    const double shard = params / sharding.group(GradGroup::dense).shards() +
                         experts / sharding.group(GradGroup::expert).shards();
    const double opt = optimizer_s(dev, shard, mixed);
    // ZeRO-1/2 all-gather the updated parameters after the optimizer (param_gather_exposed); ZeRO-3 under pp > 1
    // gathers the stage's parameters at the start of the next step before its first forward (its first block's at
    // least).
    const double gather = param_gather_exposed(g, sharding, cc, first_f, overlap, params, experts, dp_hidden) +
                          (pp > 1 ? dp_comm_s(sharding, g, params, experts, {Issued::block_first_run}) : 0);
    // The reductions and gathers hidden behind the compute take their share of it (Link::overlap_compute_share).
    end += g.dp_path.compute_share * dp_hidden;
    // The FP8 weights' codes, made by the step's first forward of each block: priced once a step, added here (the
    // simulator's per-micro-batch costs hold none of it).
    const double rank_step = std::max(end, comm_free) + zero_drain + opt + gather + fp8_weights;
    if (rank_step > step) {
      step = rank_step;
      r.dp_comm_exposed_s = std::max(0.0, comm_free - end) + gather + zero_exposed + zero_drain;
      r.optimizer_s = opt;
      r.tp_cp_comm_s = comm;
      r.ep_comm_s = ep_comm;
      r.cp_hidden_s = cp_hidden;
      r.ep_hidden_s = ep_hidden;
      r.tp_hidden_s = tp_hidden;
      r.compute_s = busy - comm - zero_exposed + g.dp_path.compute_share * dp_hidden + fp8_weights;
    }
  }
  r.step_time_s = step;
}

}  // namespace

StepPrediction predict_step(const Cluster& cl, const Config& cfg, bool time_only_if_fits, PlannedKernels kernels) {
  return predict_step(cl, cfg, layout_facts(cfg), time_only_if_fits, kernels);
}

StepPrediction predict_step(const Cluster& cl, const Config& cfg, const LayoutFacts& facts, bool time_only_if_fits,
                            PlannedKernels kernels) {
  ScheduleCache schedules;
  return predict_step(cl, cfg, facts, schedules, time_only_if_fits, kernels);
}

StepPrediction predict_step(const Cluster& cl, const Config& cfg, const LayoutFacts& facts, ScheduleCache& schedules,
                            bool time_only_if_fits, PlannedKernels kernels) {
  const Cluster::Device& dev = cl.device;
  const int tp = int(cfg.parallel.tp), cp = int(cfg.parallel.cp), dp = int(cfg.parallel.dp), pp = int(cfg.parallel.pp);
  const ModelLayout& layout = facts.layout;
  ScheduleShape shape = schedule_shape(cfg);
  shape.tied = facts.tied;
  const int64_t T = layout.model.seq_len;
  const Precision prec = cfg.train.precision;
  const double e = double(dtype_size(compute_dtype(prec)));

  StepPrediction r;
  r.devices = dp * cp * tp * pp;
  // Memory: the memory plan of every pipeline rank, tp rank 0, as `relay plan --config` prints it (the first holds the
  // most micro-batches in flight and the last the head, but a middle one may hold the most: DeepSeek-V3's MoE layers);
  // ZeRO-3 adds what is gathered at once and, under pp > 1, the whole gradients.
  const PlannedSchedule& memory_schedule = schedules.get(schedule_shape(cfg));  // untied, as a run's memory plan reads it
  for (int p = 0; p < pp; ++p) {
    const MemoryBytes b = predict_memory(cfg, layout, facts.stages[size_t(p)], p, 0, &memory_schedule);
    r.stage_memory_bytes.push_back(double(b.total() + b.gathered) + double(b.step_grads));
    r.memory_bytes_per_device = std::max(r.memory_bytes_per_device, r.stage_memory_bytes.back());
  }
  r.fits = r.memory_bytes_per_device + dev.reserved_bytes <= dev.memory_bytes;
  r.checkpoint_bytes = facts.checkpoint_bytes;
  if (time_only_if_fits && !r.fits) return r;

  const Groups g = step_groups(cl, cfg, T, kernels);
  const Sharding sharding = describe_sharding(sharding_input(cfg));
  ChunkCosts cc = chunk_costs(dev, layout, g, sharding, tp, int(cfg.parallel.ep), pp,
                              cfg.parallel.overlap || cl.async_progress);
  // A pipeline send: one (rows, C) activation (rows / tp of it under sequence parallelism), to the rank tp x cp x dp
  // ranks on.
  const double boundary = e * double(g.ctx.rows) * double(layout.model.blocks[1].in) / (g.ctx.sequence_parallel ? tp : 1);
  cc.costs.comm = pp > 1 ? send_s(cl, tp * cp * dp, boundary) : 0;
  r.pipeline_comm_s = cc.costs.comm;
  const SimResult sim = simulate(shape, schedules.get(shape).lists, cc.costs);
  r.bubble_fraction = sim.bubble_fraction;
  rank_steps(dev, g, sharding, cc, shape, sim, e != 4, cfg.parallel.overlap, r);

  const double step = r.step_time_s;
  r.exposed_comm_s = r.tp_cp_comm_s + r.dp_comm_exposed_s + (pp > 1 ? 2.0 * (shape.m + pp - 1) * cc.costs.comm / pp : 0);
  const double tokens = double(cfg.train.batch_size) * double(T);
  const double model_flops = model_flops_per_row(layout.model);  // what the trainer's logged MFU counts too
  const double recompute_flops = g.ctx.recompute ? recomputed_flops_per_row(layout.model) : 0;
  r.tokens_per_s_per_device = tokens / step / r.devices;
  r.mfu = model_flops * tokens / step / r.devices / dev.peak(prec);
  r.hardware_flops_per_s_per_device = (model_flops + recompute_flops) * tokens / step / r.devices;
  return r;
}

}  // namespace relay
