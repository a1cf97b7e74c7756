// relay plan --config FILE: the pipeline plan without MPI: stages, the step x rank grid of the
// schedule, the simulated bubble (equal F/B/W costs, and with --measure per-layer costs timed here)
// and the peak number of micro-batches whose activations each stage holds; the 3D layout (which world
// rank holds which (dp, tp, pp) coordinate and which shard) and the memory each rank will hold.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include "backend/backend.hpp"
#include "cli/commands.hpp"
#include "io/dataset.hpp"
#include "model/family.hpp"
#include "model/model_spec.hpp"
#include "model/moe.hpp"
#include "parallel/process_grid.hpp"
#include "parallel/sharding.hpp"
#include "parallel/simulator.hpp"
#include "plan/calibration.hpp"
#include "plan/link_calibration.hpp"
#include "plan/measure.hpp"
#include "train/checkpointing.hpp"
#include "train/memory_plan.hpp"
#include "train/model_layout.hpp"

namespace relay {

CLI::App* add_plan_command(CLI::App& app, PlanOptions& o) {
  auto* c = app.add_subcommand("plan", "Print the pipeline plan and its simulated bubble (no MPI needed)");
  c->add_option("--config,-c", o.config, "TOML config file")->required();
  c->add_option("--set", o.overrides, "Override a key: --set section.key=value");
  c->add_flag("--measure", o.measure, "Also time every layer's forward, backward-input and backward-weight here (on one "
                                      "CPU thread, or the GPU when train.device is cuda)");
  c->add_option("--input-dim", o.input_dim, "Input width D when data.train is not there yet");
  c->add_option("--trace", o.trace, "Also write the simulated schedule (1 time unit = 1 ms) as a Chrome trace-event "
                                    "file, the format of a run's trace.json, to open side by side");
  c->add_option("--calibrate", o.calibrate, "With --measure: write this machine, measured at the model's shapes, as a "
                                            "cluster file for --cluster (one device = one rank of train.threads, 1 "
                                            "when 0)");
  c->add_option("--cluster", o.cluster, "Plan at cluster scale on this cluster description (configs/clusters/*.toml): "
                                        "predicted step time, MFU and memory of the best layouts");
  c->add_option("--nodes", o.nodes, "With --cluster: the number of nodes");
  c->add_option("--global-batch", o.global_batch, "With --cluster: sequences per step (train.batch_size)");
  c->add_option("--seq", o.seq, "With --cluster: tokens per sequence (model.block_size)");
  c->add_option("--top", o.top, "With --cluster: how many layouts to print (default 5)");
  c->add_flag("--layout", o.layout, "With --cluster: evaluate the config's own layout (parallel.*, train.*, "
                                    "optimizer.zero) instead of searching");
  c->add_flag("--json", o.json, "With --cluster: one JSON object per layout, one a line");
  c->add_option("--device-mtbf-hours", o.device_mtbf_hours, "With --cluster: mean time between failures of one "
                                                            "device, for the checkpoint interval (default: Llama 3's fleet)");
  c->add_option("--attention", o.attention,
                "With --cluster: the attention kernels to price: flash (Relay's, the default) or materialised (the (T, T) "
                "scores written to memory, as Megatron-LM 2021 ran; to compare with such published runs)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, PlannedAttention>{
          {"flash", PlannedAttention::flash}, {"materialised", PlannedAttention::materialised}}));
  c->add_option("--elementwise", o.elementwise,
                "With --cluster: the memory-bound kernels to price: fused (Relay's, the default) or eager (PyTorch "
                "eager's one kernel per op: RMSNorm, RoPE and SwiGLU decomposed, an f32 loss; to compare with runs "
                "such as torchtitan's published ones)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, PlannedElementwise>{
          {"fused", PlannedElementwise::fused}, {"eager", PlannedElementwise::eager}}));
  return c;
}

namespace {

// World rank -> (dp, cp, tp, pp) coordinate, stage, tensor-parallel shard and (context parallelism) the tokens of each
// sequence it holds (Megatron-LM's order: tp fastest, then cp, dp, pp), one line per rank (the first 64).
void print_layout(const Config& cfg, const ModelLayout& layout) {
  const int dp = static_cast<int>(cfg.parallel.dp), tp = static_cast<int>(cfg.parallel.tp), pp = layout.pp;
  const int cp = static_cast<int>(cfg.parallel.cp);
  if (cp > 1)
    std::printf("\n4D layout: world rank = ((pp x %d + dp) x %d + cp) x %d + tp\n", dp, cp, tp);
  else
    std::printf("\n3D layout: world rank = (pp x %d + dp) x %d + tp\n", dp, tp);
  const int n = dp * cp * tp * pp;
  const int64_t T = layout.model.seq_len, c = T / (2 * cp);
  for (int w = 0; w < std::min(n, 64); ++w) {
    const GridCoord g = grid_coord(w, dp, tp, cp);
    const int t = g.tp_rank, d = g.dp_rank, p = g.pp_rank;
    const std::string shard = layout.model.tp_shard(tp, t);
    if (cp > 1) {
      const int64_t a = g.cp_rank * c, b = (2 * cp - 1 - g.cp_rank) * c;
      std::printf("  rank %3d (dp %d, cp %d, tp %d, pp %d): %s; tokens [%lld, %lld) and [%lld, %lld) of each sequence\n",
                  w, d, g.cp_rank, t, p, shard.c_str(), static_cast<long long>(a), static_cast<long long>(a + c),
                  static_cast<long long>(b), static_cast<long long>(b + c));
    } else {
      std::printf("  rank %3d (dp %d, tp %d, pp %d): %s\n", w, d, t, p, shard.c_str());
    }
  }
  if (n > 64) std::printf("  ... %d ranks in all\n", n);
}

// Predicted bytes per rank (replicas hold the same), MiB.
void print_memory(const Config& cfg, const ModelLayout& layout) {
  const int tp = static_cast<int>(cfg.parallel.tp);
  const GroupSharding dense = describe_sharding(sharding_input(cfg)).group(GradGroup::dense);
  std::printf("\npredicted memory per rank, MiB (%s; every replica the same%s%s):\n",
              precision_name(cfg.train.precision),
              dense.stage ? cat("; ZeRO-", dense.stage, ": ", sharded_states(dense), " sharded").c_str() : "",
              cfg.train.recompute == "blocks" ? "; transformer blocks recomputed" : "");
  std::printf("  pp  tp      params       grads   optimizer activations       total\n");
  for (int p = 0; p < layout.pp; ++p)
    for (int t = 0; t < tp; ++t) {
      const MemoryBytes b = predict_memory(cfg, layout, p, t);
      std::printf("  %2d  %2d %11s %11s %11s %11s %11s\n", p, t, mib(b.params).c_str(), mib(b.grads).c_str(),
                  mib(b.optimizer).c_str(), mib(b.activations).c_str(), mib(b.total()).c_str());
    }
  if (dense.parameters)
    for (int p = 0; p < layout.pp; ++p) {
      const MemoryBytes b = predict_memory(cfg, layout, p, 0);
      std::printf("  pp %d: beyond the table, ZeRO-3's gathered parameters at their most (freed %s): %s MiB%s; the "
                  "step's peak %s MiB\n",
                  p, dense.gathered_kept ? "after the step" : "after each block", mib(b.gathered).c_str(),
                  b.step_grads ? cat(", and the step's whole gradients: ", mib(b.step_grads), " MiB").c_str() : "",
                  mib(b.total() + b.gathered + b.step_grads).c_str());
    }
  // Rank 0's host copy of a checkpoint (train/checkpoint_writer.hpp).
  const std::string ck = mib(checkpoint_bytes(layout, cfg.optimizer));
  if (cfg.checkpoint.async)
    std::printf("checkpoint: %s MiB; checkpoint.async = true: rank 0 keeps a host copy of it (pinned on CUDA) for "
                "the whole run, beyond the above, and training continues while a writer thread writes the file\n",
                ck.c_str());
  else
    std::printf("checkpoint: %s MiB; checkpoint.async = false: every rank waits while rank 0 writes it, streamed: rank 0 "
                "holds one tensor at a time (the largest: %s MiB) beyond the above (checkpoint.async = true keeps a whole "
                "copy and writes in the background)\n",
                ck.c_str(), mib(checkpoint_largest_tensor_bytes(layout, cfg.optimizer)).c_str());
}

// The data-parallel collectives of a step on pp rank 0, tp rank 0 (the others alike), as parallel/sharding.hpp
// describes them: per gradient group what ZeRO shards, and each move with its bytes, ranks, when it is issued, what
// waits for it and the bytes a rank sends in a ring; under ZeRO-2 and 3 also the buckets one by one, as the memory
// plan replays the schedule through them.
void print_data_parallel(const Config& cfg, const ModelLayout& layout) {
  ShardingInput in = sharding_input(cfg);
  if (in.replicas <= 1) return;
  const StageParams sp = stage_params(layout, 0, int(cfg.parallel.tp), 0);
  in.dense_elements = double(sp.numel - sp.expert);
  in.expert_elements = double(sp.expert);
  const Sharding sh = describe_sharding(in);
  std::printf("\ndata-parallel collectives per step on each rank of pp rank 0, tp rank 0 (%d replicas, %d "
              "micro-batches):\n%s",
              in.replicas, in.micro_batches, render_sharding(sh).c_str());
  const GroupSharding& dense = sh.group(GradGroup::dense);
  if (!dense.gradients) return;
  const ZeroTwoBuckets z = zero2_buckets(cfg, layout, 0, 0, in.replicas);
  auto mb = [](double bytes) { return mib(static_cast<int64_t>(bytes)); };
  const double wire = double(dtype_size(in.wire));
  if (dense.grads == GradHold::pooled)
    std::printf("  bucket by bucket (the schedule replayed): %lld gradient reduce-scatters a step, %s MiB (a bucket "
                "that blocks far apart write, the tied embedding's, once per run of its writers); the gradients held "
                "are the shard and %lld bucket buffers (%s MiB)\n",
                static_cast<long long>(z.launches), mb(wire * double(z.launched_elements)).c_str(),
                static_cast<long long>(z.pool_buffers), mb(4.0 * double(z.pool_elements)).c_str());
  if (dense.parameters)
    std::printf("  bucket by bucket: %s MiB of parameters all-gathered a step (a unit that two blocks use, the "
                "tied embedding, for each); gathered at once: at most %s MiB (%s)\n",
                mb(double(z.gathered_bytes)).c_str(), mb(double(z.gathered_peak_bytes)).c_str(),
                dense.gathered_kept ? "every unit of the rank, kept for the step"
                                    : "two blocks: the running one and the next, prefetched");
}

// Expert parallelism: which experts each ep rank holds, and per pp rank the bytes of its experts' weights, gradients and
// optimizer state and of the all-to-all buffers (parts of the memory table's columns).
void print_experts(const Config& cfg, const ModelLayout& layout) {
  const int ep = layout.ep;
  if (ep <= 1) return;
  int64_t E = 0, k = 0;
  for (const BlockSpec& b : layout.blocks())
    if (b.moe.on()) E = b.moe.n_experts, k = b.moe.k;
  // The experts' ZeRO stage, over their copies (none without copies: parallel/sharding.hpp).
  const GroupSharding es = describe_sharding(sharding_input(cfg)).group(GradGroup::expert);
  const int64_t act = int64_t(dtype_size(compute_dtype(cfg.train.precision)));
  const int64_t moments = cfg.optimizer.name == "adamw" ? 2 : cfg.optimizer.momentum != 0 ? 1 : 0;
  const int64_t n = micro_batch_rows(cfg) * layout.model.seq_len / cfg.parallel.cp;  // rows of a micro-batch
  std::printf("\nexpert parallelism: ep %d of the %lld dp ranks; each MoE layer's %lld experts, %lld per rank:\n", ep,
              static_cast<long long>(cfg.parallel.dp), static_cast<long long>(E), static_cast<long long>(E / ep));
  for (int r = 0; r < ep; ++r) {
    std::string ranks;
    for (int d = r; d < cfg.parallel.dp && d < r + 8 * ep; d += ep) ranks += cat(ranks.empty() ? "" : ", ", d);
    if (r + 8 * ep < cfg.parallel.dp) ranks += ", ...";
    std::printf("  ep rank %d (dp ranks %s): experts %lld..%lld of every MoE layer\n", r, ranks.c_str(),
                static_cast<long long>(r * (E / ep)), static_cast<long long>((r + 1) * (E / ep) - 1));
  }
  std::printf("  each expert's gradients summed over %d rank%s%s; a micro-batch's rows of a MoE layer reach their "
              "experts and come back in all-to-alls (at most ep x %lld tokens x min(k = %lld, %lld) rows received: "
              "dropless)\n", es.ranks, es.ranks > 1 ? "s" : "",
              es.stage ? cat(" (ZeRO-", es.stage, ": its ", sharded_states(es), " sharded over them)").c_str() : "",
              static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(E / ep));
  for (int p = 0; p < layout.pp; ++p) {
    const int64_t numel = stage_params(layout, p, int(cfg.parallel.tp), 0).expert;
    int64_t exchange = 0;
    for (int c = p; c < layout.num_chunks(); c += layout.pp)
      for (int i = layout.chunks[size_t(c)].begin; i < layout.chunks[size_t(c)].end; ++i)
        if (layout.blocks()[size_t(i)].moe.on())
          exchange += MoeMlp::exchange_bytes(layout.blocks()[size_t(i)], n, int(cfg.parallel.tp));
    // ZeRO-3: the masters' piece (gathered while a block runs); ZeRO-2, 3: the gradients' shard (beside the pool).
    const int64_t weights = es.parameters ? 4 * numel / es.ranks : 4 * numel + (act != 4 ? act * numel : 0);
    const int64_t grads = es.gradients ? 4 * numel / es.ranks
                                       : 4 * numel + (es.optimizer_state ? 4 * numel / es.ranks : 0);
    const int64_t state = moments * 4 * (numel / es.shards());
    std::printf("  pp %d: its experts' weights %s MiB, gradients %s MiB, optimizer state %s MiB; all-to-all buffers %s "
                "MiB per micro-batch in flight (in the activations)\n",
                p, mib(weights).c_str(), mib(grads).c_str(), mib(state).c_str(), mib(exchange).c_str());
  }
}

void print_sim(const char* title, const ScheduleShape& shape, const SimResult& sim) {
  std::printf("\n%s\n%s", title, render_grid(shape, sim).c_str());
  std::printf("bubble fraction %.4f (idle time / (ranks x makespan)); makespan %.4g\n", sim.bubble_fraction,
              sim.makespan);
  for (size_t s = 0; s < sim.idle.size(); ++s)
    std::printf("  pp rank %zu: busy %.4g, idle %.4g, peak micro-batches holding activations %d\n", s, sim.busy[s],
                sim.idle[s], sim.peak_live_micro_batches[s]);
}


int plan_body(const PlanOptions& o, Config& cfg, const LinkCalibration* links);

}  // namespace

int run_plan_command(const PlanOptions& o) {
  if (!o.cluster.empty()) return run_plan_cluster(o);
  Config cfg = load_config(o.config, o.overrides);
  if (o.calibrate.empty() || !o.measure || !LaunchedRanks::launched()) return plan_body(o, cfg, nullptr);
  LaunchedRanks ranks;
  const LinkCalibration links = ranks.measure(cfg);
  if (ranks.rank() != 0) return ranks.wait_for_rank0();
  int status = 1;
  try {
    status = plan_body(o, cfg, &links);
  } catch (...) {
    ranks.release(1);
    throw;
  }
  ranks.release(status);
  return status;
}

namespace {

int plan_body(const PlanOptions& o, Config& cfg, const LinkCalibration* links) {
  int64_t D = o.input_dim;
  if (D <= 0 && !make_model_spec(cfg, 1).language_model) {
    DatasetSpec spec;
    spec.targets = cfg.model.loss == "mse" ? TargetKind::dense : TargetKind::class_index;
    D = Hdf5Dataset(cfg.data.train, spec, "data.train").features();
  }
  ModelLayout layout = make_layout(cfg, D);
  ScheduleShape shape = schedule_shape(cfg);
  shape.tied = !layout.shared_params().empty();
  const int64_t dp = cfg.parallel.dp, m = cfg.train.micro_batches, rows = micro_batch_rows(cfg);
  const int64_t tp = cfg.parallel.tp, cp = cfg.parallel.cp;
  std::printf("plan for %s: dp %lld%s x %stp %lld x pp %lld = %lld ranks, schedule %s, v = %d, %lld micro-batches of %lld "
              "samples\n",
              cfg.source.c_str(), static_cast<long long>(dp),
              cfg.parallel.ep > 1 ? cat(" (ep ", cfg.parallel.ep, ")").c_str() : "", cp > 1 ? cat("cp ", cp, " x ").c_str() : "",
              static_cast<long long>(tp), static_cast<long long>(cfg.parallel.pp),
              static_cast<long long>(dp * cp * tp * cfg.parallel.pp), cfg.parallel.schedule.c_str(), shape.v,
              static_cast<long long>(m), static_cast<long long>(rows));
  if (cp > 1)
    std::printf("context parallelism: each sequence of %lld tokens over %lld ranks, %lld tokens each (2 chunks of "
                "%lld); attention all-gathers a micro-batch's keys and values over the group once in the forward and "
                "once in the backward, and reduce-scatters their gradients\n",
                static_cast<long long>(layout.model.seq_len), static_cast<long long>(cp),
                static_cast<long long>(layout.model.seq_len / cp), static_cast<long long>(layout.model.seq_len / cp / 2));
  if (cfg.parallel.sequence_parallel)
    std::printf("sequence parallelism: between the tensor-parallel projections (norms, residual adds) each tp rank "
                "holds %lld of a micro-batch's %lld rows (tokens) on the rank, tp rank t rows [t x %lld, (t + 1) x "
                "%lld); all-gathers before the column-parallel projections and reduce-scatters after the row-parallel "
                "ones replace the all-reduces\n",
                static_cast<long long>(rows * layout.model.seq_len / cp / tp),
                static_cast<long long>(rows * layout.model.seq_len / cp),
                static_cast<long long>(rows * layout.model.seq_len / cp / tp),
                static_cast<long long>(rows * layout.model.seq_len / cp / tp));
  std::printf("model: %s, %lld parameters, input width %lld; stages:\n%s", cfg.model.type.c_str(),
              static_cast<long long>(layout.param_count()), static_cast<long long>(D),
              describe_partition(layout.chunks, layout.blocks(), shape.pp).c_str());
  print_layout(cfg, layout);
  print_memory(cfg, layout);
  print_data_parallel(cfg, layout);
  print_experts(cfg, layout);
  auto lists = generate_all(shape);
  SimResult eq = simulate(shape, lists, Costs{});
  print_sim("schedule with equal F, B and W costs (F = forward, B = backward-input, W = backward-weight):", shape, eq);
  if (!o.trace.empty()) {
    write_sim_trace(o.trace, shape, eq);
    std::printf("wrote the simulated schedule to %s (1 time unit = 1 ms)\n", o.trace.c_str());
  }
  if (o.measure) {
    // One CPU thread (fp32), or the GPU (train.device) in the run's precision.
    const Device device = resolve_device(cfg.train.device);
    const bool gpu = device == Device::cuda;
    auto be = make_backend(BackendOptions{device, 1, 0, gpu ? cfg.train.precision : Precision::fp32});
    const int64_t act_rows = rows * layout.model.seq_len;
    std::printf("\nmeasured per-block times on this machine (%s, %lld rows), ms:\n", gpu ? be->describe().c_str() : "1 thread",
                static_cast<long long>(act_rows));
    const MeasuredCosts measured = measure_costs(*be, layout, act_rows);
    for (const BlockSpec& b : layout.blocks()) {
      const BlockTimes& t = measured.blocks[size_t(b.index)];
      std::printf("  block %2d %-11s F %8.3f  B %8.3f  W %8.3f\n", b.index, block_kind_name(b.kind), 1e3 * t.forward,
                  1e3 * t.backward_input, 1e3 * t.backward_weight);
    }
    SimResult ms = simulate(shape, lists, measured.costs);
    print_sim("schedule with the measured costs (time in seconds):", shape, ms);
    if (!o.calibrate.empty()) {
      const int threads = cfg.train.threads > 0 ? int(cfg.train.threads) : 1;
      auto cb = make_backend(BackendOptions{device, threads, 0, cfg.train.precision, cfg.train.cpu_bf16_gemm});
      const std::string text = calibrate_this_machine(*cb, layout, act_rows / cp, threads, cfg.train.precision, links);
      std::ofstream f(o.calibrate, std::ios::trunc);
      if (!f || !(f << text)) throw Error(cat("--calibrate ", o.calibrate, ": cannot write the file"));
      std::printf("\nwrote this machine's calibration to %s (use it as --cluster %s):\n%s", o.calibrate.c_str(),
                  o.calibrate.c_str(), text.c_str());
    }
  } else if (!o.calibrate.empty()) {
    throw Error("--calibrate: needs --measure (it measures this machine)");
  }
  return 0;
}

}  // namespace

}  // namespace relay
