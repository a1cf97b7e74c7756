// One interface for all communication between ranks: point-to-point activations and gradients,
// all-reduce of gradient buckets, broadcast, host-scalar reductions and barriers.
// Implementations: MpiCommunicator (CPU, and GPU staged through host) and NcclCommunicator (GPU).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace relay {

enum class ReduceOp { sum, max, min };

// A pending non-blocking operation; the tensors involved must stay alive until wait() returns.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete; drives progress
  // What a wait on this request waits for, for the progress watchdog's message
  // ("its activation of micro-batch 3"); set by the caller before wait().
  std::string what = "a message";
};
using RequestPtr = std::unique_ptr<Request>;

// A request that was done when it was made (an operation a communicator ran at once).
class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi" or "nccl"
  // parallel.overlap: this communicator's non-blocking collectives are handed to the job's progress thread
  // (comm/progress.hpp) so that they move while the rank computes; set on the data-parallel communicators, whose
  // collectives are waited for long after they start. NCCL progresses on its own streams: nothing to do.
  virtual void set_background_progress(bool) {}

  // Non-blocking point-to-point on tensors (device memory on GPU backends). Messages between one
  // pair with one tag arrive in the order they were sent.
  virtual RequestPtr isend(const Tensor& t, int peer, int tag) = 0;
  virtual RequestPtr irecv(Tensor& t, int peer, int tag) = 0;
  // In-place reduction over all members; non-blocking.
  virtual RequestPtr iallreduce(Tensor& t, ReduceOp op) = 0;
  RequestPtr iallreduce_sum(Tensor& t) { return iallreduce(t, ReduceOp::sum); }
  // ZeRO: in (size x n) summed over the members, member r receiving elements [r n, (r + 1) n) in out (n)
  // (in and out must not overlap); and the reverse, in place: member r's part [r n, (r + 1) n) of
  // buf (size x n) copied to every member. Non-blocking.
  virtual RequestPtr ireduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  virtual RequestPtr iallgather(Tensor& buf) = 0;
  // The same all-gather, started in turn: in the order of the calls, a few travelling at once (ZeRO-1/2's parameter
  // gathers after the update: started together they share the link, and the bucket the next forward reads first
  // arrives only when nearly all have). Every member calls it in the same order. NCCL runs a stream's collectives in
  // order anyway (this default starts it now); MPI queues it on the progress thread's lane (comm/progress.hpp).
  virtual RequestPtr iallgather_in_turn(Tensor& buf) { return iallgather(buf); }
  virtual void broadcast(Tensor& t, int root) = 0;
  // Expert parallelism's exchange, blocking and watched: send's first send_rows[0] rows (dim 0) go to member 0, the
  // next send_rows[1] to member 1, and so on; recv gets recv_rows[p] rows from each member p, in member order. Both
  // tensors have the same dtype and row width; the counts agree pairwise (exchange them with alltoall_host first).
  virtual void alltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                             const std::vector<int64_t>& recv_rows, const std::string& what) = 0;
  // The same, non-blocking (parallel.overlap: expert parallelism's two parts, model/moe.cpp): send and recv must stay
  // alive and untouched until the request's wait returns; the counts are copied. This default runs alltoall_rows at
  // once and returns a finished request (NCCL keeps today's blocking order; MPI overrides it with MPI_Ialltoallv).
  virtual RequestPtr ialltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                                    const std::vector<int64_t>& recv_rows, const std::string& what);

  // Blocking reductions of a few host doubles (losses, norms, flags); always exact and ordered.
  // `what` names the reduction in the progress watchdog's message.
  virtual void allreduce_host(double* values, int count, ReduceOp op, const std::string& what = "a host reduction") = 0;
  // Every member's `count` host doubles into all (size x count, member order) on root; all is not
  // touched elsewhere. Blocking and watched, like allreduce_host (per-rank timings, memory reports).
  virtual void gather_f64(const double* mine, int count, double* all, int root, const std::string& what) = 0;
  // send (size x count host int64s): block p to member p; recv (size x count): block p from member p. Blocking, watched.
  virtual void alltoall_host(const int64_t* send, int64_t* recv, int count, const std::string& what) = 0;
  virtual void barrier() = 0;

  // Blocking transfers of host bytes, for reports, traces and checkpoints (on GPU communicators they
  // travel over MPI beside the device traffic). `what` names the transfer in the watchdog's message.
  // gather_host: every member's `bytes` bytes (lengths may differ) to `root`, which gets them
  // concatenated in rank order and, when sizes is given, each member's length; others get nothing.
  virtual std::vector<std::byte> gather_host(const void* data, size_t bytes, int root, std::vector<size_t>* sizes,
                                             const std::string& what) = 0;
  // Point-to-point: messages between one pair with one tag arrive in the order they were sent.
  virtual void send_host(const void* data, size_t bytes, int peer, int tag, const std::string& what) = 0;
  virtual void recv_host(void* data, size_t bytes, int peer, int tag, const std::string& what) = 0;
};

inline RequestPtr Communicator::ialltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                                               const std::vector<int64_t>& recv_rows, const std::string& what) {
  alltoall_rows(send, send_rows, recv, recv_rows, what);
  return std::make_unique<DoneRequest>();
}

}  // namespace relay
