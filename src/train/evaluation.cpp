// Evaluation: every replica scores its share of the eval set with forward passes only; the sums are
// reduced over the world. For GPT the loss is the mean over every target token and the accuracy is
// next-token accuracy. Under expert parallelism every forward is collective over the ep group (its all-to-alls), so
// every replica runs as many batches as the largest share needs: one whose share is done scores its first sample
// again and drops the result.
#include "train/run_state.hpp"

namespace relay {

EvalResult evaluate(Run& r) {
  const ProcessGrid& g = r.grid;
  const DataSource& ev = r.eval_data;
  const int64_t N = ev.samples(), T = r.layout.model.seq_len;
  // Replica d scores samples [d*N/dp, (d+1)*N/dp) in batches of at most a training micro-batch's samples, in the
  // buffers of the training's first micro-batch (ModelChunk::slot): evaluation needs no memory of its own.
  const int64_t lo = g.dp_rank * N / g.dp, hi = (g.dp_rank + 1) * N / g.dp;
  double loss_sum = 0;
  int64_t correct = 0, counted = 0;
  const bool inputs_everywhere = r.documents.on() || g.cp > 1;  // each stage lays out the sequences itself
  std::vector<int64_t> rows;
  std::vector<float> inputs, dense;
  std::vector<int32_t> tokens, cls;
  const int64_t per = r.mb_rows;
  const int64_t mine = (hi - lo + per - 1) / per;                  // batches of this share
  const int64_t most = ((N + g.dp - 1) / g.dp + per - 1) / per;  // of the largest share
  // A forward that talks to the other replicas (parallel.ep's all-to-alls, ZeRO-3's parameter gathers) must run as
  // often on each of them: a replica with a smaller share runs filler batches, whose results it drops.
  const bool lockstep = g.ep > 1 || r.zero3;
  const int64_t batches = lockstep ? most : mine;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t at = lo + b * per;
    const bool filler = b >= mine;  // a forward only to keep the replicas' collectives in step
    const int64_t n = filler ? 1 : std::min(per, hi - at);
    rows.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = filler ? std::min(lo, N - 1) : at + i;
    StepData d;
    if (ev.tokens) {
      tokens.resize(static_cast<size_t>(n * T));  // (n, T)
      cls.resize(static_cast<size_t>(n * T));     // (n, T)
      ev.tokens->read(rows, g.is_first_stage() || inputs_everywhere ? tokens.data() : nullptr,
                      g.is_last_stage() ? cls.data() : nullptr);
      d.tokens = tokens.data();
      d.class_targets = cls.data();
    } else {
      const Hdf5Dataset& f = *ev.features;
      if (g.is_first_stage()) {
        inputs.resize(static_cast<size_t>(n * f.features()));  // (n, D)
        f.read_inputs(rows, inputs.data());
        d.inputs = inputs.data();
      }
      if (g.is_last_stage()) {
        if (f.target_kind() == TargetKind::class_index) {
          cls.resize(static_cast<size_t>(n));
          f.read_targets(rows, cls.data());
          d.class_targets = cls.data();
        } else {
          dense.resize(static_cast<size_t>(n * f.target_dim()));  // (n, K)
          f.read_targets(rows, dense.data());
          d.dense_targets = dense.data();
        }
      }
    }
    double ls = 0;
    int64_t c = 0, k = 0;
    r.executor->evaluate(n, d, ls, c, k);
    if (filler) continue;
    loss_sum += ls;
    correct += c;
    counted += k;
  }
  // The tp ranks of the last stage hold the same sums: count them once; the counted targets (all rows, or all but
  // a document mask's ignored ones) likewise, from the last stage.
  const bool counts = g.tp_rank == 0 && g.is_last_stage();
  double v[3] = {counts ? loss_sum : 0.0, counts ? double(correct) : 0.0, counts ? double(counted) : 0.0};
  r.world->allreduce_host(v, 3, ReduceOp::sum, "the evaluation reduction");
  const double rows_total = r.documents.on() ? v[2] : double(N) * double(T);
  return {v[0] / rows_total, v[1] / rows_total};
}

}  // namespace relay
