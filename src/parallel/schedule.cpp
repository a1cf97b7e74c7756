// Schedule generation: each kind first orders the compute actions of one rank, then one shared pass
// adds the point-to-point messages, the gradient all-reduces and the optimizer step. GPipe
// (arXiv:1811.06965), 1F1B and interleaved 1F1B (arXiv:2104.04473), ZB-H1 (arXiv:2401.10241).
#include "parallel/schedule.hpp"

#include <algorithm>

namespace relay {

ScheduleKind parse_schedule_kind(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::gpipe;
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "interleaved") return ScheduleKind::interleaved;
  if (s == "zb-h1") return ScheduleKind::zb_h1;
  throw Error(cat("parallel.schedule = \"", s,
                  "\" is not a schedule; expected one of \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\""));
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb_h1: return "zb-h1";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "forward";
    case Op::backward: return "backward";
    case Op::backward_input: return "backward_input";
    case Op::backward_weight: return "backward_weight";
    case Op::send_activation: return "send_activation";
    case Op::recv_activation: return "recv_activation";
    case Op::send_grad: return "send_grad";
    case Op::recv_grad: return "recv_grad";
    case Op::allreduce_grads: return "allreduce_grads";
    case Op::reduce_tied_grads: return "reduce_tied_grads";
    case Op::optimizer_step: return "optimizer_step";
  }
  return "?";
}

std::string to_string(const Action& a) {
  if (a.op == Op::optimizer_step) return op_name(a.op);
  if (a.op == Op::allreduce_grads || a.op == Op::reduce_tied_grads) return cat(op_name(a.op), "(chunk ", a.chunk, ")");
  return cat(op_name(a.op), "(chunk ", a.chunk, ", mb ", a.micro_batch, ")");
}

void validate_schedule_shape(const ScheduleShape& s) {
  const char* kind = schedule_kind_name(s.kind);
  if (s.pp < 1) throw Error(cat("parallel.pp must be >= 1, got ", s.pp));
  if (s.v < 1) throw Error(cat("parallel.virtual_stages must be >= 1, got ", s.v));
  if (s.m < 1) throw Error(cat("train.micro_batches must be >= 1, got ", s.m));
  if (s.kind != ScheduleKind::interleaved && s.v != 1) {
    throw Error(cat("parallel.virtual_stages = ", s.v, " needs parallel.schedule = \"interleaved\" (got \"",
                    kind, "\"); hint: set parallel.virtual_stages = 1 or use the interleaved schedule"));
  }
  if (s.kind == ScheduleKind::interleaved) {
    if (s.pp < 2) {
      throw Error(cat("parallel.schedule = \"interleaved\" needs parallel.pp >= 2, got parallel.pp = ", s.pp,
                      "; hint: with one pipeline rank use \"1f1b\""));
    }
    if (s.v < 2) {
      throw Error(cat("parallel.schedule = \"interleaved\" needs parallel.virtual_stages >= 2, got ", s.v,
                      "; hint: with one chunk per rank use \"1f1b\""));
    }
    // Megatron's rule: micro-batches go through the chunks in groups of pp, so a partial group
    // would leave ranks waiting. It also gives m >= pp, which the bubble (p-1)/(v*m+p-1) needs.
    if (s.m % s.pp != 0) {
      throw Error(cat("parallel.schedule = \"interleaved\" needs train.micro_batches to be a multiple of "
                      "parallel.pp, got train.micro_batches = ", s.m, " and parallel.pp = ", s.pp,
                      " (parallel.virtual_stages = ", s.v, ")"));
    }
  }
  // ZB-H1 reaches its bubble (p-1)(F+B-W) only when every rank gets to the steady state, whose
  // delayed W passes fill the cool-down: that takes m >= pp. gpipe and 1f1b reach
  // (p-1)/(m+p-1) for every m >= 1, so they need no such rule.
  if (s.kind == ScheduleKind::zb_h1 && s.m < s.pp) {
    throw Error(cat("parallel.schedule = \"zb-h1\" needs train.micro_batches >= parallel.pp, got "
                    "train.micro_batches = ", s.m, " and parallel.pp = ", s.pp,
                    "; hint: raise train.micro_batches or use \"1f1b\""));
  }
}

namespace {

// GPipe: every forward, then every backward. All m micro-batches are live at the turn.
std::vector<Action> gpipe_compute(const ScheduleShape& s, int rank) {
  std::vector<Action> out;
  for (int mb = 0; mb < s.m; ++mb) out.push_back({Op::forward, rank, mb});
  for (int mb = 0; mb < s.m; ++mb) out.push_back({Op::backward, rank, mb});
  return out;
}

// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): at most pp - rank micro-batches live.
std::vector<Action> one_f_one_b_compute(const ScheduleShape& s, int rank) {
  const int warmup = std::min(s.pp - rank - 1, s.m);
  std::vector<Action> out;
  // Warm-up: the first backward reaches this rank only after micro-batch 0 went down the
  // pp - rank - 1 later ranks and back, so fill that time with forwards.
  for (int mb = 0; mb < warmup; ++mb) out.push_back({Op::forward, rank, mb});
  // Steady state: one forward, one backward; each backward frees the memory the next forward takes.
  for (int k = 0; k < s.m - warmup; ++k) {
    out.push_back({Op::forward, rank, k + warmup});
    out.push_back({Op::backward, rank, k});
  }
  // Cool-down: drain the backwards of the warm-up micro-batches.
  for (int k = s.m - warmup; k < s.m; ++k) out.push_back({Op::backward, rank, k});
  return out;
}

// Interleaved 1F1B (Megatron-LM, arXiv:2104.04473 section 2.2.2): v chunks per rank, global chunk
// j * pp + rank is this rank's local chunk j. Micro-batches go through the chunks in groups of pp,
// which cuts the bubble by v: (p-1)/(v*m+p-1).
std::vector<Action> interleaved_compute(const ScheduleShape& s, int rank) {
  const int group = s.pp * s.v;  // virtual steps per round: pp micro-batches through each local chunk
  const int total = s.m * s.v;
  // Virtual step k runs local chunk (k % group) / pp (last chunk first for backwards) on
  // micro-batch (k / group) * pp + k % pp.
  auto step = [&](Op op, int k) {
    int local = (k % group) / s.pp;
    if (op == Op::backward) local = s.v - 1 - local;
    return Action{op, local * s.pp + rank, (k / group) * s.pp + k % s.pp};
  };
  // Warm-up: (v-1)*pp forwards bring micro-batch 0 to this rank's last chunk; its backward comes
  // back 2*(pp-rank-1) steps later (down the later ranks and up again), which more forwards fill.
  const int warmup = std::min((s.pp - rank - 1) * 2 + (s.v - 1) * s.pp, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(step(Op::forward, k));
  // Steady state: one forward, one backward.
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(step(Op::forward, k + warmup));
    out.push_back(step(Op::backward, k));
  }
  // Cool-down: the remaining backwards.
  for (int k = total - warmup; k < total; ++k) out.push_back(step(Op::backward, k));
  return out;
}

// ZB-H1 (Zero Bubble, arXiv:2401.10241 section 2.1): 1F1B with the backward split into B
// (backward_input) and W (backward_weight). Rank r runs its W passes r micro-batches behind its B
// passes, so the later ranks send their B's up the pipe sooner and the deferred W's fill the
// cool-down. Bubble (p-1)(F+B-W), a third of 1F1B's when F = B = W; F-to-B live micro-batches
// stay 1F1B's pp - rank, and F-to-W live ones pp on every rank, 1F1B's peak on rank 0.
std::vector<Action> zb_h1_compute(const ScheduleShape& s, int rank) {
  const int warmup = s.pp - rank - 1;  // < m: validate_schedule_shape asks m >= pp
  std::vector<Action> out;
  int next_w = 0;
  // Warm-up: as 1F1B.
  for (int mb = 0; mb < warmup; ++mb) out.push_back({Op::forward, rank, mb});
  // Steady state: F, B and, from the rank-th iteration on, the oldest W still owed.
  for (int k = 0; k < s.m - warmup; ++k) {
    out.push_back({Op::forward, rank, k + warmup});
    out.push_back({Op::backward_input, rank, k});
    if (k >= rank) out.push_back({Op::backward_weight, rank, next_w++});
  }
  // Cool-down: each B is followed by a W while the next B's gradient travels up.
  for (int k = s.m - warmup; k < s.m; ++k) {
    out.push_back({Op::backward_input, rank, k});
    out.push_back({Op::backward_weight, rank, next_w++});
  }
  // The deferred W's fill the time the earlier ranks still spend on their last B's.
  while (next_w < s.m) out.push_back({Op::backward_weight, rank, next_w++});
  return out;
}

// Adds the messages around the compute actions: each recv right before the action that needs it
// (a recv blocks, so earlier would only stall the rank), each send right after the action that
// produced the tensor. Chunk c's gradients are all-reduced right after its last weight gradient
// (and the send_grad that goes with it, so the upstream rank is not kept waiting), and the
// optimizer step closes the list.
std::vector<Action> with_messages(const ScheduleShape& s, int rank, const std::vector<Action>& compute) {
  const int last = num_chunks(s) - 1;
  const bool remote = s.pp > 1;  // with pp > 1, neighbouring chunks always live on different ranks
  std::vector<int> weight_grads(static_cast<size_t>(num_chunks(s)), 0);
  std::vector<Action> out;
  for (const Action& a : compute) {
    const int c = a.chunk, mb = a.micro_batch;
    if (a.op == Op::forward) {
      if (remote && c > 0) out.push_back({Op::recv_activation, c, mb});
      out.push_back(a);
      if (remote && c < last) out.push_back({Op::send_activation, c, mb});
    } else if (a.op == Op::backward || a.op == Op::backward_input) {
      if (remote && c < last) out.push_back({Op::recv_grad, c, mb});
      out.push_back(a);
      if (remote && c > 0) out.push_back({Op::send_grad, c, mb});
    } else {
      out.push_back(a);
    }
    if ((a.op == Op::backward || a.op == Op::backward_weight) && ++weight_grads[static_cast<size_t>(c)] == s.m) {
      out.push_back({Op::allreduce_grads, c, -1});
    }
  }
  // A weight shared by chunk 0 and the last chunk is summed over the two ranks once both have their
  // data-parallel sums (Megatron-LM's embedding group), so the two copies stay bitwise equal.
  if (s.tied && remote) {
    if (rank == chunk_rank(s, 0)) out.push_back({Op::reduce_tied_grads, 0, -1});
    if (rank == chunk_rank(s, last)) out.push_back({Op::reduce_tied_grads, last, -1});
  }
  out.push_back({Op::optimizer_step, -1, -1});
  return out;
}

}  // namespace

std::vector<Action> generate_schedule(const ScheduleShape& s, int pp_rank) {
  validate_schedule_shape(s);
  if (pp_rank < 0 || pp_rank >= s.pp) {
    throw Error(cat("pipeline rank ", pp_rank, " is outside [0, parallel.pp = ", s.pp, ")"));
  }
  switch (s.kind) {
    case ScheduleKind::gpipe: return with_messages(s, pp_rank, gpipe_compute(s, pp_rank));
    case ScheduleKind::one_f_one_b: return with_messages(s, pp_rank, one_f_one_b_compute(s, pp_rank));
    case ScheduleKind::interleaved: return with_messages(s, pp_rank, interleaved_compute(s, pp_rank));
    case ScheduleKind::zb_h1: return with_messages(s, pp_rank, zb_h1_compute(s, pp_rank));
  }
  return {};
}

std::vector<std::vector<Action>> generate_all(const ScheduleShape& s) {
  validate_schedule_shape(s);
  std::vector<std::vector<Action>> lists;
  for (int rank = 0; rank < s.pp; ++rank) lists.push_back(generate_schedule(s, rank));
  return lists;
}

}  // namespace relay
