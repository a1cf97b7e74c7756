// relay plan --cluster FILE --nodes N --config MODEL.toml: the cluster-scale planner. Searches the layouts
// Relay can run on N nodes of the cluster (plan/search.hpp), or with --layout evaluates the config's own,
// and prints the best with predicted tokens/s per device, step time, MFU, memory, bubble, exposed
// communication, the Young/Daly checkpoint interval and one line on why; --json one object per layout.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/block_cost.hpp"
#include "model/family.hpp"
#include "plan/cluster.hpp"
#include "plan/search.hpp"
#include "plan/step_model.hpp"
#include "train/model_layout.hpp"

namespace relay {

namespace {

// Per-device MTBF when --device-mtbf-hours is not given: Llama 3 (Dubey et al., arXiv:2407.21783, section 3.3.4)
// saw 419 unexpected interruptions in 54 days of training on 16,384 H100 GPUs: 16384 x 54 x 24 / 419 = 50,677
// device-hours between failures (GPU, HBM, host, network and software faults all counted).
constexpr double kDefaultDeviceMtbfHours = 16384.0 * 54 * 24 / 419;

double gib(double bytes) { return bytes / double(int64_t(1) << 30); }

nlohmann::json layout_json(const Config& c) {
  return {{"dp", c.parallel.dp}, {"tp", c.parallel.tp}, {"pp", c.parallel.pp}, {"cp", c.parallel.cp},
          {"ep", c.parallel.ep},
          {"schedule", c.parallel.schedule}, {"virtual_stages", c.parallel.virtual_stages},
          {"sequence_parallel", c.parallel.sequence_parallel}, {"zero", c.optimizer.zero},
          {"recompute", c.train.recompute}, {"micro_batch_size", micro_batch_rows(c)},
          {"micro_batches", c.train.micro_batches}, {"batch_size", c.train.batch_size},
          {"seq", c.model.block_size}, {"precision", precision_name(c.train.precision)}};
}

// The --set flags that make a training run of this layout.
std::string set_flags(const Config& c) {
  std::string s = cat("--set parallel.dp=", c.parallel.dp, " --set parallel.tp=", c.parallel.tp,
                      " --set parallel.pp=", c.parallel.pp);
  if (c.parallel.cp > 1) s += cat(" --set parallel.cp=", c.parallel.cp);
  if (c.parallel.ep > 1) s += cat(" --set parallel.ep=", c.parallel.ep);
  if (c.parallel.pp > 1) s += cat(" --set parallel.schedule=", c.parallel.schedule);
  if (c.parallel.virtual_stages > 1) s += cat(" --set parallel.virtual_stages=", c.parallel.virtual_stages);
  if (c.parallel.stage_memory_gib > 0 && c.parallel.pp > 1)
    s += cat(" --set parallel.stage_memory_gib=", c.parallel.stage_memory_gib);
  if (c.parallel.sequence_parallel) s += " --set parallel.sequence_parallel=true";
  s += cat(" --set train.batch_size=", c.train.batch_size, " --set train.micro_batches=", c.train.micro_batches);
  if (c.optimizer.zero) s += cat(" --set optimizer.zero=", c.optimizer.zero);
  if (c.train.recompute != "none") s += cat(" --set train.recompute=", c.train.recompute);
  return s;
}

}  // namespace

int run_plan_cluster(const PlanOptions& o) {
  const Cluster cl = load_cluster(o.cluster);
  std::vector<std::string> overrides = o.overrides;
  if (o.global_batch > 0) overrides.push_back(cat("train.batch_size=", o.global_batch));
  if (o.seq > 0) overrides.push_back(cat("model.block_size=", o.seq));
  const Config base = load_config(o.config, overrides);
  if (!model_family(base).language_model())
    throw Error(cat(o.config, ": model.type = \"", base.model.type, "\": relay plan --cluster plans language models "
                    "(model.type = ", family_names(&ModelKeys::language_model), ")"));
  const double mtbf = o.device_mtbf_hours > 0 ? o.device_mtbf_hours : kDefaultDeviceMtbfHours;
  int nodes = o.nodes;
  const int64_t config_world = base.parallel.dp * base.parallel.cp * base.parallel.tp * base.parallel.pp;
  if (o.layout && nodes <= 0) nodes = int((config_world + cl.devices_per_node - 1) / cl.devices_per_node);
  if (nodes <= 0) throw Error("--nodes: required with --cluster (the number of nodes to plan for)");
  const int world = nodes * cl.devices_per_node;

  std::vector<PlannedLayout> rows;
  SearchResult sr;
  if (o.layout) {
    if (config_world != world && !(nodes == 1 && config_world < world))
      throw Error(cat("--layout: parallel.dp x cp x tp x pp = ", base.parallel.dp, " x ", base.parallel.cp, " x ",
                      base.parallel.tp, " x ", base.parallel.pp, " = ", config_world, " devices, but --nodes ", nodes,
                      " x ", cl.devices_per_node, " = ", world, "; hint: set parallel.dp with --set"));
    rows.push_back({base, predict_step(cl, base, false, {o.attention, o.elementwise}), "", {}});
    rows.back().why = rows.back().prediction.fits ? "the config's layout" : "the config's layout: DOES NOT FIT in memory";
  } else {
    sr = search_layouts(cl, base, nodes, std::max(1, o.top), {o.attention, o.elementwise});
    if (sr.evaluated == 0)
      throw Error(cat("--nodes ", nodes, ": no layout Relay can run uses ", world, " devices for this model and batch "
                      "(train.batch_size = ", base.train.batch_size, " must divide over dp, n_layer = ",
                      base.model.n_layer, " bounds pp, n_head = ", base.model.n_head, " bounds tp); hint: a node "
                      "count whose devices divide the batch, or --global-batch"));
    if (sr.best.empty()) {
      // What would fit: fp32 masters, gradients and AdamW's moments (and bf16 copies) of every parameter, sharded over
      // every device at best, bound the node count from below.
      const double per_param = 16.0 + (dtype_size(compute_dtype(base.train.precision)) == 4 ? 0.0 : 2.0);
      const double usable = cl.device.memory_bytes - cl.device.reserved_bytes;
      const double state = per_param * double(make_layout(base, 0).param_count());
      const int64_t min_nodes = int64_t(std::ceil(state / usable / cl.devices_per_node));
      throw Error(cat(o.config, ": no layout fits ", cl.name, "'s ", std::round(gib(cl.device.memory_bytes) * 10) / 10,
                      " GiB per device on ", nodes, " nodes: the smallest needs ",
                      std::round(gib(sr.smallest_memory_bytes) * 10) / 10, " GiB (", sr.smallest_layout,
                      ", the runtime's ", std::round(gib(cl.device.reserved_bytes) * 10) / 10,
                      " GiB included); the weights, gradients and optimizer state alone need ", min_nodes,
                      " nodes or more; hint: more --nodes, a shorter --seq, or a device with more memory"));
    }
    rows = sr.best;
  }

  const double peak = cl.device.peak(base.train.precision);
  for (const PlannedLayout& l : rows) {
    const StepPrediction& p = l.prediction;
    const double write_s = p.checkpoint_bytes / cl.storage_write_bandwidth;
    const int64_t every = checkpoint_every_steps(write_s, mtbf, p.devices, p.step_time_s);
    if (o.json) {
      nlohmann::json j = {{"step_time_s", p.step_time_s}, {"tokens_per_s_per_device", p.tokens_per_s_per_device},
                          {"mfu", p.mfu}, {"hardware_flops_per_s_per_device", p.hardware_flops_per_s_per_device},
                          {"memory_bytes_per_device", p.memory_bytes_per_device},
                          {"stage_memory_bytes", p.stage_memory_bytes}, {"fits", p.fits},
                          {"bubble_fraction", p.bubble_fraction}, {"exposed_comm_s", p.exposed_comm_s},
                          {"checkpoint_every", every}, {"checkpoint_write_s", write_s}, {"devices", p.devices},
                          {"cluster", cl.name}, {"layout", layout_json(l.cfg)}, {"why", l.why}};
      std::printf("%s\n", j.dump().c_str());
    }
  }
  if (o.json) return 0;

  const ModelLayout ml = make_layout(rows.front().cfg, 0);
  const std::string active =
      model_family(base).has_experts() ? cat(", ", std::round(active_parameters(ml.model) / 1e7) / 100, "B active") : "";
  std::printf("plan for %s (%s, %.2fB parameters%s, %lld sequences x %lld tokens a step) on %s: %d nodes x %d = %d "
              "devices, %s peak %.1f TFLOP/s, %.1f GiB each\n",
              o.config.c_str(), base.model.type.c_str(), double(ml.param_count()) / 1e9, active.c_str(),
              static_cast<long long>(base.train.batch_size), static_cast<long long>(base.model.block_size),
              cl.name.c_str(), nodes, cl.devices_per_node, world, precision_name(base.train.precision), peak / 1e12,
              gib(cl.device.memory_bytes));
  if (!o.layout)
    std::printf("searched %lld layouts, %lld fit in memory; the best %zu by tokens/s per device:\n",
                static_cast<long long>(sr.evaluated), static_cast<long long>(sr.fitting), rows.size());
  std::printf("\n%3s  %-52s %10s %9s %6s %9s %7s %10s %6s\n", "#", "layout", "tok/s/dev", "step(s)", "MFU", "mem(GiB)",
              "bubble", "comm(s)", "ckpt");
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepPrediction& p = rows[i].prediction;
    const double write_s = p.checkpoint_bytes / cl.storage_write_bandwidth;
    std::printf("%3zu  %-52s %10.1f %9.3f %5.1f%% %9.1f %6.1f%% %10.3f %6lld\n", i + 1,
                describe_layout(rows[i].cfg).c_str(), p.tokens_per_s_per_device, p.step_time_s, 100 * p.mfu,
                gib(p.memory_bytes_per_device), 100 * p.bubble_fraction, p.exposed_comm_s,
                static_cast<long long>(checkpoint_every_steps(write_s, mtbf, p.devices, p.step_time_s)));
    std::printf("     why: %s\n", rows[i].why.c_str());
  }
  const StepPrediction& best = rows.front().prediction;
  const double write_s = best.checkpoint_bytes / cl.storage_write_bandwidth;
  std::printf("\ntok/s/dev = batch x seq / step / devices; MFU = 3 x forward FLOPs (attention included, recomputation "
              "not) x tokens / step / devices / peak; mem = the largest rank's planned bytes (the runtime's %.1f GiB "
              "besides); comm = exposed communication a step; ckpt = checkpoint.every by Young/Daly: sqrt(2 x write "
              "x MTBF / devices) / step, with a %.0f GiB checkpoint written in %.0f s at %.1f GB/s and a device MTBF "
              "of %.0f h%s\n",
              gib(cl.device.reserved_bytes), gib(best.checkpoint_bytes), write_s, cl.storage_write_bandwidth / 1e9, mtbf,
              o.device_mtbf_hours > 0 ? "" : " (Llama 3's 16,384-GPU fleet, arXiv:2407.21783)");
  std::printf("run it: sbatch --nodes=%d jobscripts/relay-gpu.sbatch %s %s --set checkpoint.every=%lld\n", nodes,
              o.config.c_str(), set_flags(rows.front().cfg).c_str(),
              static_cast<long long>(checkpoint_every_steps(write_s, mtbf, best.devices, best.step_time_s)));
  return 0;
}

}  // namespace relay
