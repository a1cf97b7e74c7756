// The collective matmul's ring (model/collective_matmul.hpp): at step s rank r holds chunk (r - s) mod tp, sends it to
// r + 1 and receives chunk (r - s - 1) from r - 1, which held it one step earlier.
#include "model/collective_matmul.hpp"

namespace relay {

namespace {
constexpr int kTagRing = 0x7c3;  // the tp group's only point-to-point messages
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

}  // namespace relay
