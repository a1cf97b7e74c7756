#include "parallel/sharding.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "core/memory.hpp"

namespace relay {

namespace {

const char* wire_name(DType d) {
  return d == DType::bf16 ? "bf16" : d == DType::fp8_e4m3 ? "fp8 e4m3 codes, a scale per weight" : "fp32";
}
const char* what_name(Moved m) { return m == Moved::gradients ? "gradients" : "parameters"; }

}  // namespace

ShardingInput sharding_input(const Config& cfg) {
  ShardingInput in;
  in.zero = int(cfg.optimizer.zero);
  in.pp = int(cfg.parallel.pp);
  in.replicas = int(cfg.parallel.dp * cfg.parallel.cp);
  in.ep = int(cfg.parallel.ep);
  in.micro_batches = int(cfg.train.micro_batches);
  in.wire = cfg.parallel.grad_reduce == GradReduce::bf16 ? DType::bf16 : DType::f32;
  in.work = compute_dtype(cfg.train.precision);
  in.reshard_after_forward = cfg.parallel.reshard_after_forward;
  in.fp8_param_gather = cfg.parallel.fp8_param_gather;
  return in;
}

double Move::sent() const {
  if (ranks <= 1) return 0;
  const double ring = double(ranks - 1) / ranks;
  return (collective == Collective::all_reduce ? 2 : 1) * ring * bytes * per_step;
}

const Move* Sharding::find(GradGroup g, Moved what) const {
  for (const Move& m : moves)
    if (m.group == g && m.what == what) return &m;
  return nullptr;
}

Sharding describe_sharding(const ShardingInput& in) {
  RELAY_ASSERT(in.zero >= 0 && in.zero <= 3, "ZeRO stage " << in.zero << " is not 0 to 3");
  RELAY_ASSERT(in.replicas >= 1 && in.ep >= 1 && in.replicas % in.ep == 0,
               "ep " << in.ep << " does not divide the " << in.replicas << " replicas");
  Sharding s;
  s.input = in;
  const int m = in.micro_batches;
  for (GradGroup gg : {GradGroup::dense, GradGroup::expert}) {
    GroupSharding g;
    g.group = gg;
    g.ranks = gg == GradGroup::dense ? in.replicas : in.replicas / in.ep;
    g.elements = gg == GradGroup::dense ? in.dense_elements : in.expert_elements;
    // A group with no other copy (the experts at ep = dp x cp) is kept whole at every stage: the rank owns it.
    g.stage = g.ranks > 1 ? in.zero : 0;
    g.optimizer_state = g.stage >= 1;
    g.gradients = g.stage >= 2;
    g.parameters = g.stage >= 3;
    // ZeRO-3 under pp > 1 keeps a stage's gradients whole for the step and reduce-scatters them once (torchtitan's
    // choice): the pipeline's micro-batches would otherwise each pay a reduce-scatter per bucket.
    g.grads = g.stage >= 3 && in.pp > 1 ? GradHold::step_buckets
              : g.stage >= 2            ? GradHold::pooled
                                        : GradHold::buckets;
    g.gathered_kept = g.parameters && (in.pp > 1 || !in.reshard_after_forward);
    s.groups.push_back(g);
    if (g.ranks <= 1 || (gg == GradGroup::expert && in.ep <= 1)) continue;  // nothing to sum (at ep 1: no experts)

    auto move = [&](Moved what, Collective c, DType dtype, Issued issued, Needed needed, int per_step) {
      const double bytes = double(dtype_size(dtype)) * g.elements;
      s.moves.push_back({gg, what, c, dtype, bytes, g.ranks, issued, needed, per_step});
    };
    // Issued first in a step: ZeRO-3 gathers a block's parameters before it runs.
    if (g.parameters) {
      const Issued when = g.gathered_kept ? Issued::block_first_run : Issued::block_run;
      // parallel.fp8_param_gather: the dense weights as e4m3 codes, half of bf16's bytes (the experts' stay bf16).
      const DType gathered = in.fp8_param_gather && gg == GradGroup::dense ? DType::fp8_e4m3 : in.work;
      move(Moved::parameters, Collective::all_gather, gathered, when, Needed::block_run, g.gathered_kept ? 1 : 2 * m);
    }
    // The gradients' sum: whole (ZeRO-0), or each rank's shard of it.
    if (g.grads == GradHold::pooled)
      move(Moved::gradients, Collective::reduce_scatter, in.wire, Issued::bucket_done, Needed::optimizer, m);
    else
      move(Moved::gradients, g.stage == 0 ? Collective::all_reduce : Collective::reduce_scatter, in.wire,
           Issued::allreduce_grads, Needed::optimizer, 1);
    // ZeRO-1, 2: every replica holds every parameter again, the updated f32 values gathered from their owners.
    if (g.optimizer_state && !g.parameters)
      move(Moved::parameters, Collective::all_gather, DType::f32, Issued::after_optimizer, Needed::next_forward, 1);
  }
  return s;
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all-reduce";
    case Collective::reduce_scatter: return "reduce-scatter";
    case Collective::all_gather: return "all-gather";
  }
  return "?";
}

const char* issued_text(Issued i) {
  switch (i) {
    case Issued::bucket_done: return "as each bucket's last writer finishes in the backward, every micro-batch";
    case Issued::allreduce_grads: return "at the chunk's allreduce_grads, after its last micro-batch's backward";
    case Issued::after_optimizer: return "after the optimizer";
    case Issued::block_run:
      return "before each block's forward and again before its backward, every micro-batch (the next block's "
             "prefetched), freed after each";
    case Issued::block_first_run:
      return "before each block's first forward of the step (the next block's prefetched), kept to the step's end";
  }
  return "?";
}

const char* needed_text(Needed n) {
  switch (n) {
    case Needed::optimizer: return "the optimizer";
    case Needed::next_forward: return "the next step's first forward";
    case Needed::block_run: return "the block's run";
  }
  return "?";
}

std::string sharded_states(const GroupSharding& g) {
  if (g.parameters) return "parameters, gradients and optimizer state";
  if (g.gradients) return "gradients and optimizer state";
  if (g.optimizer_state) return "optimizer state";
  return "nothing";
}

std::string render_sharding(const Sharding& s) {
  std::string out;
  double sent = 0;
  for (const GroupSharding& g : s.groups) {
    if (g.group == GradGroup::expert && s.input.ep <= 1) continue;
    const char* name = g.group == GradGroup::dense ? "dense weights" : "expert weights";
    if (g.ranks <= 1) {
      out += cat("  ", name, ": ", mib(4 * g.elements), " MiB, no other copy",
                 g.group == GradGroup::expert ? " (ep = dp x cp)" : "", ": kept whole, nothing to reduce or gather\n");
      continue;
    }
    out += cat("  ", name, " (", mib(4 * g.elements), " MiB) over ", g.ranks, " ranks, ZeRO-", g.stage, ": ",
               sharded_states(g), g.stage ? cat(" sharded (1/", g.ranks, " each)") : " sharded",
               g.grads == GradHold::step_buckets ? "; gradients whole during the step" : "", "\n");
    for (const Move& m : s.moves) {
      if (m.group != g.group) continue;
      sent += m.sent();
      out += cat("    ", what_name(m.what), ": ", collective_name(m.collective), " of ", mib(m.bytes), " MiB (",
                 wire_name(m.dtype), ") ", issued_text(m.issued),
                 m.per_step > 1 ? cat(" (", m.per_step, " a step)") : "", "; needed by ", needed_text(m.needed), "; ",
                 mib(m.sent()), " MiB sent a step\n");
    }
  }
  if (s.moves.size() > 1) out += cat("  in all: ", mib(sent), " MiB sent a step by each rank\n");
  return out;
}

}  // namespace relay
