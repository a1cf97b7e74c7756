// Schedule simulator: replays all ranks' action lists as the executor would run them (non-blocking
// sends, blocking recvs, time spent only in compute) and checks every dependency on the way. The
// bubbles it measures are the papers': GPipe arXiv:1811.06965, Megatron arXiv:2104.04473, ZB arXiv:2401.10241.
#include "parallel/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/trace.hpp"

namespace relay {
namespace {

constexpr double kNotSent = -1;

void check_costs(const ScheduleShape& s, const Costs& costs) {
  auto check_value = [](const char* name, double x) {
    if (!(x >= 0) || !std::isfinite(x)) {
      throw Error(cat("Costs.", name, " holds ", x, "; costs must be finite and >= 0"));
    }
  };
  auto check_chunks = [&](const char* name, const std::vector<double>& v) {
    if (!v.empty() && v.size() != static_cast<size_t>(num_chunks(s))) {
      throw Error(cat("Costs.", name, " has ", v.size(), " entries, expected none or parallel.pp * ",
                      "parallel.virtual_stages = ", num_chunks(s)));
    }
    for (double x : v) check_value(name, x);
  };
  check_value("forward", costs.forward);
  check_value("backward_input", costs.backward_input);
  check_value("backward_weight", costs.backward_weight);
  check_value("comm", costs.comm);
  check_chunks("chunk_forward", costs.chunk_forward);
  check_chunks("chunk_backward_input", costs.chunk_backward_input);
  check_chunks("chunk_backward_weight", costs.chunk_backward_weight);
}

// One replay: what has run, per (chunk, micro-batch) and per rank.
class Replay {
 public:
  Replay(const ScheduleShape& s, const std::vector<std::vector<Action>>& lists, const Costs& costs)
      : s_(s), lists_(lists), costs_(costs), last_(num_chunks(s) - 1) {
    const size_t pairs = static_cast<size_t>(num_chunks(s)) * static_cast<size_t>(s.m);
    const size_t ranks = static_cast<size_t>(s.pp);
    forwarded_.assign(pairs, 0);
    input_grad_done_.assign(pairs, 0);
    weight_grad_done_.assign(pairs, 0);
    activation_received_.assign(pairs, 0);
    grad_received_.assign(pairs, 0);
    activation_sent_.assign(pairs, kNotSent);
    grad_sent_.assign(pairs, kNotSent);
    weight_grads_.assign(static_cast<size_t>(num_chunks(s)), 0);
    allreduced_.assign(static_cast<size_t>(num_chunks(s)), 0);
    tied_arrival_.assign(2, kNotSent);
    tied_done_.assign(2, 0);
    next_.assign(ranks, 0);
    clock_.assign(ranks, 0);
    live_.assign(ranks, 0);
    stepped_.assign(ranks, 0);
    result_.busy.assign(ranks, 0);
    result_.peak_live_micro_batches.assign(ranks, 0);
    result_.timeline.assign(ranks, {});
  }

  SimResult run() {
    // Ranks run in turn as far as they can; the times do not depend on the turn order, only on
    // each rank's own order and on when the sends it waits for ran.
    for (bool progressed = true; progressed;) {
      progressed = false;
      for (int rank = 0; rank < s_.pp; ++rank) {
        while (next_[rank] < lists_[rank].size() && try_step(rank)) progressed = true;
      }
    }
    for (int rank = 0; rank < s_.pp; ++rank) {
      if (next_[rank] < lists_[rank].size()) deadlock();
    }
    check_finished();
    return finish();
  }

 private:
  size_t at(int chunk, int mb) const { return static_cast<size_t>(chunk) * static_cast<size_t>(s_.m) + mb; }
  bool on(int rank, int chunk) const { return chunk_rank(s_, chunk) == rank; }
  static double pick(const std::vector<double>& per_chunk, double scalar, int chunk) {
    return per_chunk.empty() ? scalar : per_chunk[static_cast<size_t>(chunk)];
  }

  [[noreturn]] void reject(int rank, const Action& a, const std::string& why) const {
    throw ScheduleError(cat("schedule error at rank ", rank, ", action ", next_[rank], " ", to_string(a), ": ", why));
  }

  void check_fields(int rank, const Action& a) const {
    if (a.op == Op::optimizer_step) {
      if (a.chunk != -1 || a.micro_batch != -1) reject(rank, a, "optimizer_step takes chunk -1 and micro-batch -1");
      return;
    }
    if (a.chunk < 0 || a.chunk > last_) reject(rank, a, cat("chunk is outside [0, pp*v = ", last_ + 1, ")"));
    if (a.op == Op::allreduce_grads || a.op == Op::reduce_tied_grads) {
      if (a.micro_batch != -1) reject(rank, a, cat(op_name(a.op), " takes micro-batch -1"));
    } else if (a.micro_batch < 0 || a.micro_batch >= s_.m) {
      reject(rank, a, cat("micro-batch is outside [0, train.micro_batches = ", s_.m, ")"));
    }
    if (!on(rank, a.chunk)) reject(rank, a, cat("chunk ", a.chunk, " lives on rank ", chunk_rank(s_, a.chunk)));
  }

  void compute(int rank, const Action& a, double cost) {
    const double start = clock_[rank];
    clock_[rank] += cost;
    result_.busy[rank] += cost;
    result_.timeline[rank].push_back({a, start, clock_[rank]});
  }

  // Runs the rank's next action; false while it is a recv whose send has not run yet.
  bool try_step(int rank) {
    const Action& a = lists_[rank][next_[rank]];
    if (stepped_[rank]) {
      reject(rank, a, a.op == Op::optimizer_step ? "duplicate optimizer_step"
                                                 : "comes after optimizer_step, which must be the last action");
    }
    check_fields(rank, a);
    const int c = a.chunk, mb = a.micro_batch;
    const size_t i = c >= 0 && mb >= 0 ? at(c, mb) : 0;
    auto pair = [&] { return cat("micro-batch ", mb, " of chunk ", c); };
    auto named = [&](Op op, int chunk) { return to_string(Action{op, chunk, mb}); };
    switch (a.op) {
      case Op::forward:
        if (forwarded_[i]) reject(rank, a, pair() + " is forwarded twice");
        if (c > 0 && on(rank, c - 1) && !forwarded_[at(c - 1, mb)]) {
          reject(rank, a, cat("needs chunk ", c - 1, "'s output, but ", named(Op::forward, c - 1), " has not run"));
        }
        if (c > 0 && !on(rank, c - 1) && !activation_received_[i]) {
          reject(rank, a, cat("uses its input before it arrives: no ", named(Op::recv_activation, c), " before it"));
        }
        compute(rank, a, pick(costs_.chunk_forward, costs_.forward, c));
        forwarded_[i] = 1;
        result_.peak_live_micro_batches[rank] = std::max(result_.peak_live_micro_batches[rank], ++live_[rank]);
        break;
      case Op::backward:
      case Op::backward_input: {
        if (input_grad_done_[i]) reject(rank, a, pair() + " goes through backward twice");
        if (!forwarded_[i]) reject(rank, a, "runs before " + named(Op::forward, c));
        if (c < last_ && on(rank, c + 1) && !input_grad_done_[at(c + 1, mb)]) {
          reject(rank, a, cat("needs chunk ", c + 1, "'s input gradient, but its backward has not run"));
        }
        if (c < last_ && !on(rank, c + 1) && !grad_received_[i]) {
          reject(rank, a, cat("uses its output gradient before it arrives: no ", named(Op::recv_grad, c),
                              " before it"));
        }
        const double input = pick(costs_.chunk_backward_input, costs_.backward_input, c);
        const double weight = pick(costs_.chunk_backward_weight, costs_.backward_weight, c);
        compute(rank, a, a.op == Op::backward ? input + weight : input);
        input_grad_done_[i] = 1;
        --live_[rank];
        if (a.op == Op::backward) {
          weight_grad_done_[i] = 1;
          ++weight_grads_[c];
        }
        break;
      }
      case Op::backward_weight:
        if (weight_grad_done_[i]) reject(rank, a, pair() + " has its weight gradient computed twice");
        if (!input_grad_done_[i]) reject(rank, a, "runs before " + named(Op::backward_input, c));
        compute(rank, a, pick(costs_.chunk_backward_weight, costs_.backward_weight, c));
        weight_grad_done_[i] = 1;
        ++weight_grads_[c];
        break;
      case Op::send_activation:
        if (c == last_) reject(rank, a, "the last chunk's output is the loss; there is no next chunk");
        if (on(rank, c + 1)) reject(rank, a, cat("chunk ", c + 1, " lives on this rank too; pass the tensor locally"));
        if (!forwarded_[i]) reject(rank, a, "sends the output before " + named(Op::forward, c) + " ran");
        if (activation_sent_[i] != kNotSent) reject(rank, a, "sent twice");
        activation_sent_[i] = clock_[rank];
        break;
      case Op::recv_activation: {
        if (c == 0) reject(rank, a, "chunk 0 reads the data; it receives no activation");
        if (on(rank, c - 1)) reject(rank, a, cat("chunk ", c - 1, " lives on this rank too; pass the tensor locally"));
        if (activation_received_[i]) reject(rank, a, "received twice");
        const double sent = activation_sent_[at(c - 1, mb)];
        if (sent == kNotSent) return false;
        clock_[rank] = std::max(clock_[rank], sent + costs_.comm);
        activation_received_[i] = 1;
        break;
      }
      case Op::send_grad:
        if (c == 0) reject(rank, a, "chunk 0 has no previous chunk to send its input gradient to");
        if (on(rank, c - 1)) reject(rank, a, cat("chunk ", c - 1, " lives on this rank too; pass the tensor locally"));
        if (!input_grad_done_[i]) {
          reject(rank, a, cat("sends the input gradient before ", named(Op::backward, c), " or ",
                              named(Op::backward_input, c), " ran"));
        }
        if (grad_sent_[i] != kNotSent) reject(rank, a, "sent twice");
        grad_sent_[i] = clock_[rank];
        break;
      case Op::recv_grad: {
        if (c == last_) reject(rank, a, "the last chunk starts the backward from the loss; it receives no gradient");
        if (on(rank, c + 1)) reject(rank, a, cat("chunk ", c + 1, " lives on this rank too; pass the tensor locally"));
        if (grad_received_[i]) reject(rank, a, "received twice");
        const double sent = grad_sent_[at(c + 1, mb)];
        if (sent == kNotSent) return false;
        clock_[rank] = std::max(clock_[rank], sent + costs_.comm);
        grad_received_[i] = 1;
        break;
      }
      case Op::allreduce_grads:
        if (allreduced_[c]) reject(rank, a, "duplicate allreduce_grads for this chunk");
        if (weight_grads_[c] < s_.m) {
          int missing = 0;
          while (weight_grad_done_[at(c, missing)]) ++missing;
          reject(rank, a, cat("runs before the chunk's last weight gradient: micro-batch ", missing,
                              " has no backward or backward_weight yet"));
        }
        allreduced_[c] = 1;
        break;
      case Op::reduce_tied_grads: {
        // A two-rank collective: it returns once the partner has reached its own reduce_tied_grads.
        if (!s_.tied || s_.pp == 1) reject(rank, a, "the model shares no weight between two pipeline ranks");
        if (c != 0 && c != last_) reject(rank, a, "only chunk 0 and the last chunk share the tied weight");
        const size_t side = c == 0 ? 0 : 1;
        if (tied_arrival_[side] == kNotSent) {
          if (!allreduced_[c]) reject(rank, a, cat("runs before allreduce_grads(chunk ", c, ")"));
          tied_arrival_[side] = clock_[rank];
        }
        if (tied_arrival_[1 - side] == kNotSent) return false;
        clock_[rank] = std::max(clock_[rank], tied_arrival_[1 - side]);
        tied_done_[side] = 1;
        break;
      }
      case Op::optimizer_step:
        for (int chunk = rank; chunk <= last_; chunk += s_.pp) {
          if (!allreduced_[chunk]) reject(rank, a, cat("runs before allreduce_grads(chunk ", chunk, ")"));
        }
        if (s_.tied && s_.pp > 1) {
          if (on(rank, 0) && !tied_done_[0]) reject(rank, a, "runs before reduce_tied_grads(chunk 0)");
          if (on(rank, last_) && !tied_done_[1]) reject(rank, a, cat("runs before reduce_tied_grads(chunk ", last_, ")"));
        }
        stepped_[rank] = 1;
        break;
    }
    ++next_[rank];
    return true;
  }

  // Every unfinished rank waits in a recv whose send cannot come: say who waits for whom.
  [[noreturn]] void deadlock() const {
    std::string msg = "schedule error: deadlock, no rank can proceed";
    for (int rank = 0; rank < s_.pp; ++rank) {
      if (next_[rank] >= lists_[rank].size()) continue;
      const Action& a = lists_[rank][next_[rank]];
      if (a.op == Op::reduce_tied_grads) {
        const int partner = chunk_rank(s_, a.chunk == 0 ? last_ : 0);
        msg += cat("\n  rank ", rank, ", action ", next_[rank], " ", to_string(a), " waits for rank ", partner,
                   " to reach its reduce_tied_grads, but rank ", partner, " is blocked at action ", next_[partner],
                   next_[partner] < lists_[partner].size() ? " " + to_string(lists_[partner][next_[partner]]) : "");
        continue;
      }
      const bool activation = a.op == Op::recv_activation;
      const Action send = activation ? Action{Op::send_activation, a.chunk - 1, a.micro_batch}
                                     : Action{Op::send_grad, a.chunk + 1, a.micro_batch};
      const int src = chunk_rank(s_, send.chunk);
      const auto& src_list = lists_[src];
      const auto it = std::find(src_list.begin(), src_list.end(), send);
      std::string why;
      if (it == src_list.end()) {
        why = cat("which never sends it");
      } else {
        why = cat("which sends it at its action ", it - src_list.begin(), " but is blocked at action ", next_[src], " ",
                  to_string(src_list[next_[src]]));
      }
      msg += cat("\n  rank ", rank, ", action ", next_[rank], " ", to_string(a), " waits for ", to_string(send),
                 " from rank ", src, ", ", why);
    }
    throw ScheduleError(msg + "\nwhat ran before the deadlock:\n" + render_grid(s_, finish()));
  }

  void check_finished() const {
    for (int c = 0; c <= last_; ++c) {
      for (int mb = 0; mb < s_.m; ++mb) {
        const size_t i = at(c, mb);
        const char* missing = !forwarded_[i]          ? "never runs forward"
                              : !input_grad_done_[i]  ? "is forwarded but never runs backward or backward_input"
                              : !weight_grad_done_[i] ? "never runs backward_weight"
                                                      : nullptr;
        if (missing) {
          throw ScheduleError(cat("schedule error: micro-batch ", mb, " of chunk ", c, " (rank ", chunk_rank(s_, c),
                                  ") is unfinished: it ", missing));
        }
      }
    }
    for (int rank = 0; rank < s_.pp; ++rank) {
      if (!stepped_[rank]) {
        throw ScheduleError(cat("schedule error: rank ", rank, "'s list ends without optimizer_step (",
                                "it must be the last action)"));
      }
    }
  }

  SimResult finish() const {
    SimResult r = result_;
    r.makespan = *std::max_element(clock_.begin(), clock_.end());
    double idle = 0;
    for (double busy : r.busy) {
      r.idle.push_back(r.makespan - busy);
      idle += r.makespan - busy;
    }
    r.bubble_fraction = r.makespan > 0 ? idle / (s_.pp * r.makespan) : 0;
    return r;
  }

  const ScheduleShape& s_;
  const std::vector<std::vector<Action>>& lists_;
  const Costs& costs_;
  const int last_;  // the last chunk, which computes the loss
  // Per (chunk, micro-batch), index at(chunk, mb).
  std::vector<char> forwarded_, input_grad_done_, weight_grad_done_, activation_received_, grad_received_;
  std::vector<double> activation_sent_, grad_sent_;  // send time, kNotSent before the send
  // Per chunk.
  std::vector<int> weight_grads_;
  std::vector<char> allreduced_;
  // reduce_tied_grads of chunk 0 [0] and of the last chunk [1]: arrival time and completion.
  std::vector<double> tied_arrival_;
  std::vector<char> tied_done_;
  // Per rank.
  std::vector<size_t> next_;
  std::vector<double> clock_;
  std::vector<int> live_;
  std::vector<char> stepped_;
  SimResult result_;
};

}  // namespace

SimResult simulate(const ScheduleShape& s, const std::vector<std::vector<Action>>& lists, const Costs& costs) {
  if (s.pp < 1 || s.v < 1 || s.m < 1) {
    throw Error(cat("cannot simulate parallel.pp = ", s.pp, ", parallel.virtual_stages = ", s.v,
                    ", train.micro_batches = ", s.m, "; each must be >= 1"));
  }
  if (lists.size() != static_cast<size_t>(s.pp)) {
    throw Error(cat("simulate: got ", lists.size(), " action lists for parallel.pp = ", s.pp, " ranks"));
  }
  check_costs(s, costs);
  return Replay(s, lists, costs).run();
}

std::string render_grid(const ScheduleShape& s, const SimResult& r) {
  double unit = 0;  // the shortest compute action; with equal costs, one action per column
  for (const auto& row : r.timeline) {
    for (const TimedAction& t : row) {
      if (t.end > t.start && (unit == 0 || t.end - t.start < unit)) unit = t.end - t.start;
    }
  }
  constexpr double kMaxColumns = 2000;  // a much shorter action would make lines no terminal can show
  unit = std::max(unit, r.makespan / kMaxColumns);
  const int columns = unit > 0 ? static_cast<int>(std::lround(r.makespan / unit)) : 0;
  std::vector<std::vector<std::string>> cells(r.timeline.size(), std::vector<std::string>(columns, "."));
  size_t width = 1;
  for (size_t rank = 0; rank < r.timeline.size() && unit > 0; ++rank) {
    for (const TimedAction& t : r.timeline[rank]) {
      const Action& a = t.action;
      const char letter = a.op == Op::forward ? 'F' : a.op == Op::backward_weight ? 'W' : 'B';
      const std::string token = s.v > 1 ? cat(letter, a.micro_batch, '.', a.chunk) : cat(letter, a.micro_batch);
      width = std::max(width, token.size());
      const int first = static_cast<int>(std::lround(t.start / unit));
      const int end = std::min(columns, std::max(first + 1, static_cast<int>(std::lround(t.end / unit))));
      for (int col = first; col < end; ++col) cells[rank][col] = token;
    }
  }
  const size_t label = std::to_string(r.timeline.empty() ? 0 : r.timeline.size() - 1).size();
  std::string out;
  for (size_t rank = 0; rank < cells.size(); ++rank) {
    std::string line = "rank " + std::string(label - std::to_string(rank).size(), ' ') + std::to_string(rank) + " |";
    for (const std::string& cell : cells[rank]) line += " " + cell + std::string(width - cell.size(), ' ');
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  out += cat("(a column is ", unit, " time unit; F forward, B backward or backward_input, W backward_weight",
             s.v > 1 ? "; F3.5 = micro-batch 3 on chunk 5" : "", "; '.' idle)\n");
  return out;
}

void write_sim_trace(const std::string& path, const ScheduleShape& shape, const SimResult& sim) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r},
                      {"args", {{"name", cat("pipeline rank ", r, " (simulated)")}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    for (const TimedAction& t : sim.timeline[r]) {
      const char* op = op_name(t.action.op);
      events.push_back({{"ph", "X"}, {"name", compute_span_name(op, t.action.micro_batch, t.action.chunk, shape.v > 1)},
                        {"cat", "compute"}, {"pid", r}, {"tid", 0}, {"ts", t.start * 1000.0},
                        {"dur", (t.end - t.start) * 1000.0},
                        {"args", {{"step", 1}, {"micro_batch", t.action.micro_batch}, {"chunk", t.action.chunk}, {"op", op}}}});
    }
  }
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw Error(cat("--trace ", path, ": cannot write the file"));
  f << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

}  // namespace relay
