#include "plan/link_calibration.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "comm/progress.hpp"
#include "core/error.hpp"

namespace relay {

double CollectiveSample::bus_factor() const {
  const double n = ranks;
  return op == "all_reduce" ? 2 * (n - 1) / n : (n - 1) / n;
}

double CollectiveSample::reduced_bytes() const {
  return op == "all_reduce" || op == "reduce_scatter" ? bytes * (ranks - 1) / ranks : 0;
}

namespace {

// The field of `m` that holds collective `op`'s bus bandwidth (null: not one of the four).
template <class M>
auto* measured_of(M& m, const std::string& op) {
  return op == "all_reduce"       ? &m.all_reduce
         : op == "all_gather"     ? &m.all_gather
         : op == "reduce_scatter" ? &m.reduce_scatter
         : op == "all_to_all"     ? &m.all_to_all
                                  : nullptr;
}

}  // namespace

double LinkFit::op_busbw(const CollectiveSample& s) const {
  const double* v = measured_of(measured, s.op);
  return v ? *v : 0;
}

double CollectiveSample::steps() const { return op == "all_reduce" ? 2.0 * (ranks - 1) : double(ranks - 1); }

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The slowest member's mean seconds of `run` over repeats lasting about `budget` seconds, after a warm-up (connections,
// buffers) and one timed call that sets the repeat count (2 to 100, the members' slowest call: every member repeats
// alike): the best of three such trials (a rank descheduled by another process's burst would otherwise stretch one
// trial by milliseconds). A fixed byte count per trial made a slow link (TCP between two namespaces of a 2-core
// machine) take minutes; a time budget keeps a fast link's 100 repeats and gives a slow one its 2.
// On a GPU a collective's wait() only orders the compute stream after it: the device is synchronised at both ends.
template <class F>
double slowest_mean(Communicator& g, Backend& be, double budget, F run) {
  run();
  be.synchronize();
  g.barrier();
  double once = now();
  run();
  be.synchronize();
  once = now() - once;
  g.allreduce_host(&once, 1, ReduceOp::max, "a calibration timing");
  const int reps = int(std::clamp(budget / std::max(once, 1e-9), 2.0, 100.0));
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    be.synchronize();
    g.barrier();
    const double t0 = now();
    for (int i = 0; i < reps; ++i) run();
    be.synchronize();
    double t = (now() - t0) / reps;
    g.allreduce_host(&t, 1, ReduceOp::max, "a calibration timing");
    best = trial == 0 ? t : std::min(best, t);
  }
  return best;
}

Tensor zeros(Backend& be, Shape shape) {
  Tensor t(be, std::move(shape), DType::f32);
  be.fill(t, 0.f);
  return t;
}

}  // namespace

std::vector<CollectiveSample> time_collectives(Communicator& g, Backend& be) {
  const int n = g.size();
  RELAY_ASSERT(n >= 2, "timing collectives needs a group of two or more ranks");
  constexpr int64_t kWidth = 256;  // all-to-all row: 1 KiB of f32
  std::vector<CollectiveSample> out;
  for (int64_t bytes = int64_t(4) << 10; bytes <= int64_t(16) << 20; bytes *= 4) {
    constexpr double budget = 0.05;  // seconds of repeats per size, operation and trial
    const int64_t m = std::max<int64_t>(1, bytes / 4 / n);  // f32 elements per member
    {
      Tensor t = zeros(be, {n * m});  // (n m) each member's whole buffer
      out.push_back({"all_reduce", n, 4.0 * double(n * m), slowest_mean(g, be, budget, [&] { g.iallreduce_sum(t)->wait(); })});
    }
    {
      Tensor buf = zeros(be, {n * m});  // (n m) member r's part [r m, (r + 1) m)
      out.push_back({"all_gather", n, 4.0 * double(n * m), slowest_mean(g, be, budget, [&] { g.iallgather(buf)->wait(); })});
    }
    {
      Tensor in = zeros(be, {n * m}), piece = zeros(be, {m});  // (n m) -> (m)
      out.push_back({"reduce_scatter", n, 4.0 * double(n * m),
                     slowest_mean(g, be, budget, [&] { g.ireduce_scatter_sum(in, piece)->wait(); })});
    }
    {
      const int64_t rows = std::max<int64_t>(1, bytes / (4 * kWidth) / n);  // rows to each member
      Tensor send = zeros(be, {n * rows, kWidth}), recv = zeros(be, {n * rows, kWidth});  // (n rows, 256)
      const std::vector<int64_t> counts(size_t(n), rows);
      out.push_back({"all_to_all", n, 4.0 * double(n * rows * kWidth), slowest_mean(g, be, budget, [&] {
                       g.alltoall_rows(send, counts, recv, counts, "a calibration all-to-all");
                     })});
    }
  }
  return out;
}

double overlap_compute_share(Communicator& g, Backend& be, double allreduce_16mib_s) {
  if (!ProgressThread::supported()) return -1;
  constexpr int64_t k = 256;
  Tensor a = zeros(be, {k, k}), b = zeros(be, {k, k}), y = zeros(be, {k, k});  // (k, k) y = a b
  auto gemm = [&] {
    be.matmul(a, false, b, false, y, 1.f, 0.f);
    be.synchronize();
  };
  gemm();
  // Alone: GEMMs for 0.3 s on every member at once.
  g.barrier();
  double t0 = now(), t = t0;
  int64_t alone = 0;
  for (; t - t0 < 0.3; t = now()) gemm(), ++alone;
  const double rate_alone = double(alone) / (t - t0);
  // Beside: the same while the all-reduces run, each started when the last is done, moved by a progress thread.
  const int reps = int(std::clamp(0.5 / std::max(allreduce_16mib_s, 1e-6), 2.0, 200.0));
  Tensor buf = zeros(be, {int64_t(4) << 20});  // (4 Mi) f32: 16 MiB
  double rate_beside = 0;
  {
    ProgressThread progress;
    set_active_progress(&progress);
    g.set_background_progress(true);
    g.barrier();
    int64_t beside = 0;
    t0 = now();
    for (int i = 0; i < reps; ++i) {
      auto req = g.iallreduce_sum(buf);
      while (!req->test()) gemm(), ++beside;
      req->wait();
    }
    rate_beside = double(beside) / (now() - t0);
    g.set_background_progress(false);
    set_active_progress(nullptr);
  }
  double share = std::clamp(1 - rate_beside / rate_alone, 0.0, 1.0);
  g.allreduce_host(&share, 1, ReduceOp::sum, "a calibration timing");
  return share / g.size();
}

namespace {

// Weighted least squares of y(s) = k x(s) through the origin over the samples `use` keeps, each weighted by 1 / t
// (relative error): k, or 0 when no sample is kept.
template <class Use, class X, class Y>
double slope(const std::vector<CollectiveSample>& samples, Use use, X x, Y y) {
  double xx = 0, xy = 0;
  for (const CollectiveSample& s : samples) {
    if (!(s.seconds > 0) || !use(s)) continue;
    const double w2 = 1 / (s.seconds * s.seconds);
    xx += w2 * x(s) * x(s), xy += w2 * x(s) * y(s);
  }
  return xx > 0 ? xy / xx : 0;
}

}  // namespace

LinkFit fit_link(const std::vector<CollectiveSample>& samples) {
  constexpr double kLarge = 1 << 20, kSmall = 64 << 10;  // bytes
  const bool any_move = std::any_of(samples.begin(), samples.end(), [](const CollectiveSample& s) { return s.reduced_bytes() == 0; });
  auto move = [&](const CollectiveSample& s) { return !any_move || s.reduced_bytes() == 0; };
  auto bus_bytes = [](const CollectiveSample& s) { return s.bytes * s.bus_factor(); };
  auto time = [](const CollectiveSample& s) { return s.seconds; };
  auto large_move = [&](const CollectiveSample& s) { return move(s) && s.bytes >= kLarge; };
  auto small_move = [&](const CollectiveSample& s) { return move(s) && s.bytes <= kSmall; };
  auto steps = [](const CollectiveSample& s) { return s.steps(); };
  LinkFit f;
  // 1 / busbw from the large moves, as nccl-tests' headline busbw, and alpha from the small ones, each after the
  // other's part of the time: alternated until they settle (exact on times that follow the form).
  double alpha = 0, beta = 0;
  for (int it = 0; it < 50; ++it) {
    beta = slope(samples, large_move, bus_bytes, [&](const CollectiveSample& s) { return s.seconds - alpha * s.steps(); });
    if (!(beta > 0)) beta = slope(samples, move, bus_bytes, time);
    if (!(beta > 0)) return f;
    alpha = std::max(0.0, slope(samples, small_move, steps,
                                [&](const CollectiveSample& s) { return s.seconds - beta * bus_bytes(s); }));
  }
  f.ok = true;
  f.busbw = 1 / beta;
  f.latency = alpha;
  // 1 / reduce_bw from what the large reductions take beyond a move of their bytes.
  if (any_move) {
    const double r = slope(samples, [&](const CollectiveSample& s) { return s.reduced_bytes() > 0 && s.bytes >= kLarge; },
                           [](const CollectiveSample& s) { return s.reduced_bytes(); },
                           [&](const CollectiveSample& s) { return s.seconds - f.predict(s); });
    if (r > 0) f.reduce_bw = 1 / r;
  }
  // Each collective's own busbw: 1 / the slope of its largest samples' time beyond the latency over their bus bytes
  // (4 MiB and more: a rank descheduled for a time slice on a loaded machine stretches a 1 MiB collective over a slow
  // link by half; the runs' buckets are tens of MiB).
  constexpr double kBucket = 4 << 20;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
    const double k = slope(samples, [&](const CollectiveSample& s) { return s.op == op && s.bytes >= kBucket; }, bus_bytes,
                           [&](const CollectiveSample& s) { return s.seconds - f.latency * s.steps(); });
    if (k > 0) *measured_of(f.measured, op) = 1 / k;
  }
  double sq = 0;
  for (const CollectiveSample& s : samples) {
    const double e = f.predict(s) / s.seconds - 1;
    sq += e * e;
  }
  f.rms_error = std::sqrt(sq / double(std::max<size_t>(1, samples.size())));
  return f;
}

std::string samples_table(const std::vector<CollectiveSample>& samples, const LinkFit& fit) {
  std::string s = "#   collective      ranks      bytes    time (us)  algbw (GB/s)  busbw (GB/s)   fit\n";
  char line[160];
  for (const CollectiveSample& c : samples) {
    std::snprintf(line, sizeof line, "#   %-14s %6d %10.0f %12.1f %13.3f %13.3f %+6.0f%%\n", c.op.c_str(), c.ranks,
                  c.bytes, 1e6 * c.seconds, c.algbw() / 1e9, c.busbw() / 1e9,
                  fit.ok ? 100 * (fit.predict(c) / c.seconds - 1) : 0.0);
    s += line;
  }
  return s;
}

}  // namespace relay
