#include "plan/search.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "model/family.hpp"
#include "plan/layout_cache.hpp"
#include "train/model_layout.hpp"

namespace relay {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string gib(double bytes) { return cat(std::round(bytes / double(1 << 30) * 10) / 10); }

// A tp that the model's heads, key/value heads, SwiGLU width and vocabulary split into (its family's rule).
bool tp_splits(const Config& c, int tp) { return model_family(c).tp_splits(c.model, tp); }

std::string why_line(const Cluster& cl, const PlannedLayout& l, const std::map<std::pair<int, int>, bool>& fit_tp_pp,
                     double params) {
  const auto& p = l.cfg.parallel;
  const StepPrediction& s = l.prediction;
  std::vector<std::string> parts;
  if (p.tp > 1) parts.push_back(cat("tp ", p.tp, " inside a node"));
  if (p.pp > 1) {
    bool smaller_fits = false;
    for (auto& [k, fits] : fit_tp_pp)
      if (k.first == p.tp && k.second < p.pp && fits) smaller_fits = true;
    parts.push_back(smaller_fits ? cat("pp ", p.pp) : cat("pp ", p.pp, " to fit ", std::round(params / 1e9), "B"));
    parts.push_back(cat(std::round(s.bubble_fraction * 100), "% bubble with ", p.schedule,
                        p.virtual_stages > 1 ? cat(" v", p.virtual_stages) : ""));
  }
  if (p.cp > 1)
    parts.push_back(cat("cp ", p.cp, " for ", l.cfg.model.block_size, "-token sequences",
                        s.cp_hidden_s > 0 ? cat(" (its key/value gathers ", std::round(100 * s.cp_hidden_s / s.step_time_s),
                                                "% of the step, hidden behind the own rows' attention)")
                                          : std::string()));
  if (p.ep > 1) {
    const int64_t E = model_family(l.cfg).experts(l.cfg.model);
    const bool inside = int64_t(p.ep) * p.tp * p.cp <= cl.devices_per_node;
    parts.push_back(cat("ep ", p.ep, ": ", E / p.ep, " of ", E, " experts a rank, ",
                        std::round(100 * s.ep_comm_s / s.step_time_s), "% of the step in all-to-alls ",
                        inside ? "over NVLink" : "across nodes"));
  }
  if (!l.memory_cut.empty()) {
    // Where the memory term moved blocks: each stage's blocks and planned GiB (the compute-balanced cut overfilled one).
    std::string b, m;
    for (size_t i = 0; i < l.memory_cut.size(); ++i) {
      b += cat(i ? "+" : "", l.memory_cut[i]);
      m += cat(i ? "/" : "", gib(s.stage_memory_bytes.at(i)));
    }
    parts.push_back(cat("stages cut to fit the device (parallel.stage_memory_gib): ", b, " blocks, ", m, " GiB"));
  }
  if (l.cfg.optimizer.zero) parts.push_back(cat("ZeRO-", l.cfg.optimizer.zero, " over ", p.dp * p.cp, " replicas"));
  if (l.cfg.train.recompute == "blocks") parts.push_back("recompute to fit activations");
  parts.push_back(cat(std::round(100 * s.exposed_comm_s / s.step_time_s), "% of the step in exposed communication"));
  parts.push_back(cat(gib(s.memory_bytes_per_device), " of ", gib(cl.device.memory_bytes - cl.device.reserved_bytes),
                      " GiB"));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

}  // namespace

SearchResult search_layouts(const Cluster& cl, const Config& base, int nodes, int top, PlannedKernels kernels) {
  const int world = nodes * cl.devices_per_node;
  const int64_t B = base.train.batch_size, T = base.model.block_size;
  const int64_t blocks = base.model.n_layer + 2;
  const double usable_gib = (cl.device.memory_bytes - cl.device.reserved_bytes) / double(int64_t(1) << 30);
  SearchResult res;
  res.smallest_memory_bytes = -1;
  std::vector<PlannedLayout> all;
  std::map<std::pair<int, int>, bool> fit_tp_pp;
  double params = 0;
  // Mixtures of experts: the experts split over ep of the dp ranks too (ep divides dp and the experts; every ZeRO
  // stage), and each expert over tp like the dense SwiGLU (the family's tp_splits).
  const ModelFamily& family = model_family(base);
  const bool moe = family.has_experts();
  ScheduleCache schedules;  // every schedule shape's lists and slots, kept for the whole search
  for (int tp : divisors(cl.devices_per_node)) {
    if (world % tp || !tp_splits(base, tp)) continue;
    for (int cp = 1; cp <= world / tp; cp *= 2) {
      if (cp > 1 && (T % (2 * cp) || T / cp < 4096)) break;  // cp is for long sequences: >= 4096 tokens a rank
      if ((world / tp) % cp) break;
      if (cp > 1 && !family.cp_splits(base.model, cp)) break;
      for (int pp : divisors(world / (tp * cp))) {
        if (pp > blocks) break;
        const int dp = world / (tp * cp * pp);
        if (B % dp) continue;
        // The layouts of this (tp, cp, pp) share their model layouts, stage parameters and bucket keys by (ep, v):
        // built once each here, then dropped (DeepSeek-V3's hold 45,000 named parameters each).
        LayoutCache shapes(&schedules);
        for (int64_t mbs : {1, 2, 4}) {
          if ((B / dp) % mbs) continue;
          const int64_t m = B / dp / mbs;
          struct Sched { const char* name; int v; };
          std::vector<Sched> scheds = {{"1f1b", 1}};
          if (pp > 1) scheds = {{"1f1b", 1}, {"interleaved", 2}, {"interleaved", 4}, {"zb-h1", 1}};
          std::vector<int> eps = {1};
          if (moe)
            for (int ep : divisors(dp))
              if (ep > 1 && family.ep_splits(base.model, ep)) eps.push_back(ep);
          for (const Sched& sc : scheds) {
            // The memory term cuts one chunk a rank (parallel/partition.hpp); a config's own budget is kept.
            const bool recut = pp > 1 && sc.v == 1 && base.parallel.stage_memory_gib <= 0;
            for (int ep : eps) {
              // Cheapest in time first: ZeRO and recomputation only save memory here (ZeRO-1's smaller optimizer
              // step aside), so once two settings of this shape fit, the rest would be slower.
              int fitted = 0;
              for (const char* rc : {"none", "blocks"})
                for (int zero : {0, 1, 2, 3}) {
                  if (fitted >= 2) break;
                  if (zero && dp * cp == 1) continue;
                  // ZeRO-2 under pp > 1 reduce-scatters every micro-batch: ZeRO-1's memory, m x its bytes.
                  if (zero == 2 && pp > 1) continue;
                  if (std::string(rc) == "blocks" && std::string(sc.name) == "zb-h1") continue;
                  Config c = base;
                  c.parallel.dp = dp;
                  c.parallel.tp = tp;
                  c.parallel.cp = cp;
                  c.parallel.ep = ep;
                  c.parallel.pp = pp;
                  c.parallel.schedule = sc.name;
                  c.parallel.virtual_stages = sc.v;
                  c.parallel.sequence_parallel = tp > 1 && (T / cp) % tp == 0 && family.sequence_parallel();
                  c.parallel.balance.clear();
                  c.train.micro_batches = m;
                  c.train.recompute = rc;
                  c.optimizer.zero = zero;
                  PlannedLayout l{c, {}, {}, {}};
                  try {
                    if (pp * sc.v > blocks) continue;
                    const LayoutFacts& facts = shapes.get(c);
                    l.prediction = predict_step(cl, c, facts, schedules, /*time_only_if_fits=*/true, kernels);
                    // The stages as the base config cuts them (by compute alone unless it gives
                    // parallel.stage_memory_gib); where that cut overfills a stage, cut again among the cuts whose
                    // every stage fits the device (only then: a cut that fits is already the compute-balanced one).
                    if (!l.prediction.fits && recut) {
                      c.parallel.stage_memory_gib = usable_gib;
                      try {
                        const LayoutFacts& cut = shapes.get(c);
                        if (&cut != &facts) {
                          StepPrediction p = predict_step(cl, c, cut, schedules, /*time_only_if_fits=*/true, kernels);
                          if (p.fits || p.memory_bytes_per_device < l.prediction.memory_bytes_per_device) {
                            l.cfg = c;
                            l.prediction = std::move(p);
                            for (const ChunkRange& r : cut.layout.chunks) l.memory_cut.push_back(r.end - r.begin);
                          }
                        }
                      } catch (const Error&) {
                        // a cut Relay refuses: the layout stays as cut by compute
                      }
                      c = l.cfg;
                    }
                  } catch (const Error&) {
                    continue;  // a shape Relay refuses (the interleaved schedule's micro-batch rule, the partition)
                  }
                  ++res.evaluated;
                  const double mem = l.prediction.memory_bytes_per_device + cl.device.reserved_bytes;
                  if (res.smallest_memory_bytes < 0 || mem < res.smallest_memory_bytes) {
                    res.smallest_memory_bytes = mem;
                    res.smallest_layout = describe_layout(c);
                  }
                  fit_tp_pp[{tp, pp}] = fit_tp_pp[{tp, pp}] || l.prediction.fits;
                  if (!l.prediction.fits) continue;
                  ++fitted;
                  ++res.fitting;
                  all.push_back(std::move(l));
                }
            }
          }
        }
      }
    }
  }
  std::sort(all.begin(), all.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    return a.prediction.tokens_per_s_per_device > b.prediction.tokens_per_s_per_device;
  });
  if (int(all.size()) > top) all.resize(size_t(top));
  if (!all.empty()) {
    const ModelLayout layout = make_layout(all.front().cfg, 0);
    params = double(layout.param_count());
  }
  for (PlannedLayout& l : all) l.why = why_line(cl, l, fit_tp_pp, params);
  res.best = std::move(all);
  return res;
}

int64_t checkpoint_every_steps(double write_s, double device_mtbf_hours, int devices, double step_time_s) {
  const double job_mtbf_s = device_mtbf_hours * 3600.0 / std::max(1, devices);
  const double interval = std::sqrt(2.0 * write_s * job_mtbf_s);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(interval / step_time_s)));
}

}  // namespace relay
