#include "model/tensor_parallel.hpp"

#include <chrono>
#include <cstring>

#include "core/memory.hpp"
#include "core/test_faults.hpp"
#include "model/collective_matmul.hpp"

namespace relay {

namespace {

// The full tensor as (outer, n, inner) around the split dimension.
struct Around {
  int64_t outer = 1, n = 1, inner = 1;
};
Around around(const Shape& full, int dim) {
  RELAY_ASSERT(dim >= 0 && dim < static_cast<int>(full.size()), "split dim " << dim << " of shape " << shape_str(full));
  Around a;
  for (int i = 0; i < dim; ++i) a.outer *= full[static_cast<size_t>(i)];
  a.n = full[static_cast<size_t>(dim)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < full.size(); ++i) a.inner *= full[i];
  return a;
}

// Calls f(full_offset, shard_offset, count) for every contiguous run of the shard.
template <class F>
void for_each_run(const Shape& full, TpSplit s, int tp, int r, F f) {
  if (s.replicated() || tp == 1) {
    f(int64_t{0}, int64_t{0}, shape_numel(full));
    return;
  }
  const Around a = around(full, s.dim);
  RELAY_ASSERT(a.n % s.parts == 0, "split of " << a.n << " into " << s.parts << " parts");
  const int64_t seg = a.n / s.parts, b = tp_begin(seg, tp, r), e = tp_end(seg, tp, r), local_n = s.parts * (e - b);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int p = 0; p < s.parts; ++p)
      f((o * a.n + p * seg + b) * a.inner, (o * local_n + p * (e - b)) * a.inner, (e - b) * a.inner);
}

// One of the rank's sequence-parallel buffers (sp_rows, sp_async_rows) as (n, w), grown (counted as activations) when
// smaller or of another dtype.
Tensor shared_rows(Backend& be, Tensor& buf, int64_t n, int64_t w, DType dt) {
  if (!buf.defined() || buf.numel() < n * w || buf.dtype() != dt) {
    MemoryScope scope(MemKind::activations);
    buf = Tensor(be, {n * w}, dt);
  }
  return buf.rows(0, n * w).view({n, w});
}

// The watchdog's name of a sum over the group of `of` ("the attention output"): an all-reduce, or under sequence
// parallelism a reduce-scatter.
std::string sum_name(const char* of, bool sequence_parallel) {
  return cat(of, sequence_parallel ? " reduce-scatter" : " all-reduce");
}

}  // namespace

Shape shard_shape(const Shape& full, TpSplit s, int tp, int r) {
  if (s.replicated() || tp == 1) return full;
  const Around a = around(full, s.dim);
  const int64_t seg = a.n / s.parts;
  Shape out = full;
  out[static_cast<size_t>(s.dim)] = s.parts * (tp_end(seg, tp, r) - tp_begin(seg, tp, r));
  return out;
}

void extract_shard(const float* full, const Shape& full_shape, TpSplit s, int tp, int r, float* shard) {
  for_each_run(full_shape, s, tp, r, [&](int64_t fo, int64_t so, int64_t n) {
    std::memcpy(shard + so, full + fo, static_cast<size_t>(n) * sizeof(float));
  });
}

void insert_shard(const float* shard, const Shape& full_shape, TpSplit s, int tp, int r, float* full) {
  for_each_run(full_shape, s, tp, r, [&](int64_t fo, int64_t so, int64_t n) {
    std::memcpy(full + fo, shard + so, static_cast<size_t>(n) * sizeof(float));
  });
}

void TensorParallel::wait(Request& req, const char* what) const {
  req.what = what;
  if (!waited_s) return req.wait();
  const auto t0 = std::chrono::steady_clock::now();
  req.wait();
  *waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TensorParallel::allreduce_sum(Tensor& t, const char* what) const {
  if (!on()) return;
  RequestPtr req = comm->iallreduce(t, ReduceOp::sum);
  wait(*req, what);
}

void TensorParallel::allreduce_max(Tensor& t, const char* what) const {
  if (!on()) return;
  RequestPtr req = comm->iallreduce(t, ReduceOp::max);
  wait(*req, what);
}

void TensorParallel::allreduce_sum_during(Tensor& t, const char* what, const std::function<void()>& meanwhile) const {
  if (!on()) return meanwhile();
  RequestPtr req = overlap_comm()->iallreduce(t, ReduceOp::sum);  // the same call as allreduce_sum's: the same sums
  req->what = what;
  test_fault_point("tp");  // test only: a rank stopped or lost while it travels
  meanwhile();
  wait(*req, what);
}

double TensorParallel::take_waited_s() const {
  if (!waited_s) return 0.0;
  const double s = *waited_s;
  *waited_s = 0.0;
  return s;
}

Tensor TensorParallel::full_rows(Backend& be, int64_t n, int64_t w, DType dt) const {
  RELAY_ASSERT(sp_rows, "full_rows without sequence parallelism");
  return shared_rows(be, *sp_rows, n, w, dt);
}

Tensor TensorParallel::gather_rows(Backend& be, const Tensor& local, const char* what) const {
  const int64_t m = local.size(0), w = local.size(1);
  Tensor full = full_rows(be, size * m, w, local.dtype());
  Tensor mine = full.rows(rank * m, m);
  be.copy(mine, local);
  RequestPtr req = comm->iallgather(full);
  wait(*req, what);
  return full;
}

void TensorParallel::reduce_scatter_rows(const Tensor& full, Tensor& local, const char* what) const {
  RequestPtr req = comm->ireduce_scatter_sum(full, local);
  wait(*req, what);
}

TensorParallel::PendingGather TensorParallel::start_gather_rows(Backend& be, const Tensor& local,
                                                                const char* what) const {
  RELAY_ASSERT(sp_async_rows, "start_gather_rows without the second sequence-parallel buffer");
  const int64_t m = local.size(0), w = local.size(1);
  PendingGather g;
  g.full = shared_rows(be, *sp_async_rows, size * m, w, local.dtype());  // (tp m, w)
  Tensor mine = g.full.rows(rank * m, m);
  be.copy(mine, local);
  g.req = overlap_comm()->iallgather(g.full);
  g.req->what = what;
  g.what = what;
  return g;
}

Tensor TensorParallel::finish_gather(PendingGather& g) const {
  if (g.req) wait(*g.req, g.what);
  g.req = nullptr;
  return g.full;
}

void TensorParallel::reduce_scatter_during(const Tensor& full, Tensor& local, const char* what,
                                           const std::function<void()>& meanwhile) const {
  RequestPtr req = overlap_comm()->ireduce_scatter_sum(full, local);  // the same call as reduce_scatter_rows's
  req->what = what;
  test_fault_point("tp");  // test only: a rank stopped or lost while it travels
  meanwhile();
  wait(*req, what);
}

void TensorParallel::row_parallel_matmul(Backend& be, const Tensor& x, const Fp8Weight& w, bool trans_w, Tensor& y,
                                         const char* of, const Fp8Linear& gemm) const {
  const std::string what = sum_name(of, sequence_parallel());
  if (!sequence_parallel()) {
    gemm.matmul(be, x, w, trans_w, y);
    allreduce_sum(y, what.c_str());
    return;
  }
  if (collective_matmul(gemm)) {  // the collective matmul's reduce-scatter ring (a forward's, the head's backward)
    const int64_t m = y.size(0);
    matmul_reduce_scatter(be, *this, y, what.c_str(), [&](int64_t row0, Tensor& out) {
      gemm.matmul(be, x.rows(row0, m), w, trans_w, out);  // (m, out) of this rank's partial sums
    });
    return;
  }
  Tensor full = full_rows(be, x.size(0), y.size(1), y.dtype());  // (n, out) partial sums
  gemm.matmul(be, x, w, trans_w, full);
  reduce_scatter_rows(full, y, what.c_str());
}

void TensorParallel::sum_rows(Backend& be, Tensor& out, int64_t n, const char* of,
                              const std::function<void(Tensor& sums)>& partial) const {
  const std::string what = sum_name(of, sequence_parallel());
  if (!sequence_parallel()) {
    partial(out);  // (n, C) partial over tp
    return allreduce_sum(out, what.c_str());
  }
  Tensor sums = full_rows(be, n, out.size(1), out.dtype());  // (n, C) partial over tp
  partial(sums);
  reduce_scatter_rows(sums, out, what.c_str());  // (m, C)
}

void TensorParallel::column_input_grad(Backend& be, Tensor& dx, int64_t n, const char* of,
                                       const std::function<void(Tensor& sums)>& partial, bool early, const Tensor& x,
                                       const char* gather_what,
                                       const std::function<void(const Tensor& x_all)>& weights) const {
  if (!early) return sum_rows(be, dx, n, of, partial);
  const std::string what = sum_name(of, sequence_parallel());
  if (!sequence_parallel()) {
    partial(dx);  // (n, C) partial over tp
    return allreduce_sum_during(dx, what.c_str(), [&] { weights(x); });
  }
  PendingGather g = start_gather_rows(be, x, gather_what);  // (n, C) travels during partial's GEMMs
  Tensor sums = full_rows(be, n, dx.size(1), dx.dtype());  // (n, C) partial over tp
  partial(sums);
  reduce_scatter_during(sums, dx, what.c_str(), [&] { weights(finish_gather(g)); });
}

void SpNormGrads::allocate(Backend& be, int64_t C) {
  if (buf_.defined()) return;
  MemoryScope scope(MemKind::activations);
  buf_ = Tensor(be, {4, C});
}

void SpNormGrads::begin(Backend& be) { be.fill(buf_, 0.f); }

void SpNormGrads::finish(Backend& be, const TensorParallel& tp, const std::vector<Tensor*>& grads) {
  tp.allreduce_sum(buf_, "the sequence-parallel norm-weight gradient all-reduce");
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i] && grads[i]->defined()) {
      Tensor p = part(static_cast<int>(i));
      be.add(*grads[i], p, *grads[i]);
    }
}

}  // namespace relay
