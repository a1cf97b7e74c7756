// The collective matmul's rings (model/collective_matmul.hpp). Gather: at step s rank r holds chunk (r - s) mod tp,
// sends it to r + 1 and receives chunk (r - s - 1) from r - 1, which held it one step earlier. Reduce-scatter: at step
// s rank r sums chunk (r - 1 - s) mod tp and sends it to r + 1, which sums the same chunk one step later.
#include "model/collective_matmul.hpp"

#include <vector>

namespace relay {

namespace {
constexpr int kTagRing = 0x7c3;         // the gather ring's messages
constexpr int kTagReduceRing = 0x7c4;   // the reduce-scatter ring's
}  // namespace

Tensor gather_rows_matmul(Backend& be, const TensorParallel& tp, const Tensor& local, const char* what,
                          const std::function<void(int64_t row0, const Tensor& chunk)>& each) {
  const int P = tp.size, r = tp.rank;
  const int64_t m = local.size(0), w = local.size(1);
  Tensor full = tp.full_rows(be, P * m, w, local.dtype());  // (P m, w)
  Tensor mine = full.rows(r * m, m);
  be.copy(mine, local);
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  for (int s = 0; s < P; ++s) {
    const int have = (r - s + P) % P, coming = (r - s - 1 + 2 * P) % P;  // the chunk in hand; the one on its way
    RequestPtr recv, send;
    if (s + 1 < P) {
      Tensor in = full.rows(coming * m, m);  // (m, w)
      recv = tp.overlap_comm()->irecv(in, prev, kTagRing);
      send = tp.overlap_comm()->isend(full.rows(have * m, m), next, kTagRing);
    }
    each(have * m, full.rows(have * m, m));
    if (recv) {
      tp.wait(*recv, what);
      tp.wait(*send, what);
    }
  }
  return full;
}

Tensor gather_rows_matmul(Backend& be, const TensorParallel& tp, bool ring, const Tensor& local, const char* what,
                          const std::function<void(int64_t row0, const Tensor& chunk)>& each) {
  if (ring) return gather_rows_matmul(be, tp, local, what, each);
  const Tensor all = tp.all_rows(be, local, what);  // (tp m, w)
  each(0, all);
  return all;
}

void matmul_reduce_scatter(Backend& be, const TensorParallel& tp, Tensor& local, const char* what,
                           const std::function<void(int64_t row0, Tensor& out)>& partial) {
  const int P = tp.size, r = tp.rank;
  const int64_t m = local.size(0), w = local.size(1);
  Tensor full = tp.full_rows(be, P * m, w, local.dtype());  // (P m, w): chunk c's sum in flight in rows [c m, c m + m)
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  auto chunk = [&](int s) { return ((r - 1 - s) % P + P) % P; };  // the chunk rank r sums at step s
  auto receive = [&](int s) {  // the sum of chunk(s) over the members before r, from r - 1 (its step s - 1)
    Tensor in = full.rows(chunk(s) * m, m);
    return tp.overlap_comm()->irecv(in, prev, kTagReduceRing);
  };
  std::vector<RequestPtr> sends;
  RequestPtr recv = receive(1);
  for (int s = 0; s < P; ++s) {
    Tensor sum = full.rows(chunk(s) * m, m);  // (m, w)
    RequestPtr coming = s > 0 && s + 1 < P ? receive(s + 1) : nullptr;  // posted before this step's GEMM
    if (s == 0) {
      partial(chunk(s) * m, sum);  // the first partial of chunk r - 1: nothing to add
    } else {
      partial(chunk(s) * m, local);  // (m, w) this rank's partial of the chunk, local as scratch
      tp.wait(*recv, what);
      if (s + 1 < P) be.add(local, sum, sum);  // this rank's partial + the members' before it
      else be.add(local, sum, local);          // the last step: chunk r, this rank's rows
      recv = std::move(coming);
    }
    if (s + 1 < P) sends.push_back(tp.overlap_comm()->isend(sum, next, kTagReduceRing));  // travels during the next GEMM
  }
  for (RequestPtr& q : sends) tp.wait(*q, what);
}

}  // namespace relay
