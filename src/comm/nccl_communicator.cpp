// NCCL implementation of Communicator: one NCCL communicator for the group's collectives, one per
// ordered pair of ranks for point-to-point (see the header for why), each with its own stream, all
// ordered against the backend's compute stream with events. Host scalars and barriers stay on MPI.
#include "comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/agree.hpp"
#include "comm/host_transfer.hpp"
#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"
#include "kernels/cuda/cuda_check.cuh"

namespace relay {
namespace {

constexpr int kIdTag = 7301;        // MPI tags on this communicator's private MPI_Comm_dup
constexpr int kTagCheckTag = 7302;

ncclDataType_t nccl_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::i32: return ncclInt32;
    case DType::bf16: return ncclBfloat16;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return ncclUint8;  // moved as bytes (gathers), never reduced
    case DType::f32: break;
  }
  return ncclFloat32;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

bool tag_checks_enabled() {
#ifndef NDEBUG
  return true;
#else
  const char* env = std::getenv("RELAY_NCCL_CHECK_TAGS");
  return env && env[0] == '1';
#endif
}

// Completes when the NCCL operation's event has fired. wait() does not block the host: it makes the
// compute stream wait, so later kernels see the data and buffers are not reused too early.
class NcclRequest final : public Request {
 public:
  NcclRequest(cudaEvent_t done, cudaStream_t compute, int device) : done_(done), compute_(compute), device_(device) {}

  // Debug tag check: the sender sends its tag over MPI alongside the NCCL message; the receiver
  // compares it with the tag it posted (MPI keeps the same posting order between a pair).
  void check_tag(MPI_Comm comm, int peer, int tag, bool is_recv) {
    checking_ = true;
    is_recv_ = is_recv;
    peer_ = peer;
    expected_tag_ = tag;
    tag_buf_ = tag;
    if (is_recv)
      MPI_CHECK(MPI_Irecv(&tag_buf_, 1, MPI_INT, peer, kTagCheckTag, comm, &mpi_req_));
    else
      MPI_CHECK(MPI_Isend(&tag_buf_, 1, MPI_INT, peer, kTagCheckTag, comm, &mpi_req_));
  }

  ~NcclRequest() override {
    // A request dropped without wait() still orders later compute work after it (errors ignored:
    // this may run during shutdown).
    cudaSetDevice(device_);
    if (!waited_) cudaStreamWaitEvent(compute_, done_, 0);
    cudaEventDestroy(done_);
    if (checking_ && mpi_req_ != MPI_REQUEST_NULL) MPI_Wait(&mpi_req_, MPI_STATUS_IGNORE);
  }

  void wait() override {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    waited_ = true;
    if (checking_ && mpi_req_ != MPI_REQUEST_NULL) {
      MPI_CHECK(MPI_Wait(&mpi_req_, MPI_STATUS_IGNORE));
      verify_tag();
    }
  }

  bool test() override {
    CUDA_CHECK(cudaSetDevice(device_));
    const cudaError_t err = cudaEventQuery(done_);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    CUDA_CHECK(err);
    if (checking_ && mpi_req_ != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_CHECK(MPI_Test(&mpi_req_, &done, MPI_STATUS_IGNORE));
      if (!done) return false;
      verify_tag();
    }
    return true;
  }

 private:
  void verify_tag() const {
    if (is_recv_ && tag_buf_ != expected_tag_)
      fatal(cat("NCCL point-to-point mismatch: a receive from rank ", peer_, " posted with tag ", expected_tag_,
                " matched a send posted with tag ", tag_buf_),
            __FILE__, __LINE__,
            "NCCL matches messages from one rank to another in posting order; both ranks must post "
            "them in the same order (the schedule simulator checks this)");
  }

  cudaEvent_t done_;
  cudaStream_t compute_;
  int device_;
  bool waited_ = false;
  bool checking_ = false;
  bool is_recv_ = false;
  int peer_ = -1, expected_tag_ = 0, tag_buf_ = 0;
  MPI_Request mpi_req_ = MPI_REQUEST_NULL;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, Backend& backend, bool point_to_point) : check_tags_(tag_checks_enabled()) {
    if (backend.device() != Device::cuda)
      throw Error("the NCCL communicator needs the CUDA backend (train.device = \"cuda\")");
    compute_ = static_cast<cudaStream_t>(backend.native_stream());
    RELAY_ASSERT(compute_ != nullptr, "the CUDA backend has no stream");
    CUDA_CHECK(cudaGetDevice(&device_));  // the backend made its GPU current on this thread

    MPI_CHECK(MPI_Comm_dup(comm, &mpi_comm_));
    MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));

    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm_));
    NCCL_CHECK(ncclCommInitRank(&group_comm_, size_, id, rank_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&coll_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));

    send_comms_.assign(static_cast<size_t>(size_), nullptr);
    recv_comms_.assign(static_cast<size_t>(size_), nullptr);
    send_streams_.assign(static_cast<size_t>(size_), nullptr);
    recv_streams_.assign(static_cast<size_t>(size_), nullptr);
    if (point_to_point) create_pair_comms();
    start_watchdog();
  }

  ~NcclCommunicator() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_) return;  // the communicators are gone
    // No CHECKs: this may run during shutdown. Let queued communication finish before its
    // communicator goes away.
    cudaSetDevice(device_);
    std::vector<cudaStream_t> streams = send_streams_;
    streams.insert(streams.end(), recv_streams_.begin(), recv_streams_.end());
    streams.push_back(coll_stream_);
    for (cudaStream_t s : streams)
      if (s) cudaStreamSynchronize(s);
    // ncclCommDestroy is a collective among a communicator's ranks on one node: destroy in the same
    // global order as creation, or two ranks could each wait in a different communicator.
    for_each_pair_comm([](int, bool, ncclComm_t& c) {
      if (c) ncclCommDestroy(c);
      c = nullptr;
    });
    if (group_comm_) ncclCommDestroy(group_comm_);
    for (cudaStream_t s : streams)
      if (s) cudaStreamDestroy(s);
    if (ready_) cudaEventDestroy(ready_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi_comm_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  RequestPtr isend(const Tensor& t, int peer, int tag) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_p2p(t, peer, "isend");
    cudaStream_t stream = p2p_stream(send_streams_, peer);
    after_compute(stream);
    if (t.numel() > 0) {
      // In the (me -> peer) communicator this rank is 0 and the peer is 1.
      NCCL_CHECK(ncclGroupStart());
      NCCL_CHECK(ncclSend(t.raw(), static_cast<size_t>(t.numel()), nccl_type(t), 1, send_comms_[peer], stream));
      NCCL_CHECK(ncclGroupEnd());
    }
    auto req = finish(stream);
    if (check_tags_) req->check_tag(mpi_comm_, peer, tag, /*is_recv=*/false);
    return req;
  }

  RequestPtr irecv(Tensor& t, int peer, int tag) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_p2p(t, peer, "irecv");
    cudaStream_t stream = p2p_stream(recv_streams_, peer);
    after_compute(stream);
    if (t.numel() > 0) {
      // In the (peer -> me) communicator the peer is 0 and this rank is 1.
      NCCL_CHECK(ncclGroupStart());
      NCCL_CHECK(ncclRecv(t.raw(), static_cast<size_t>(t.numel()), nccl_type(t), 0, recv_comms_[peer], stream));
      NCCL_CHECK(ncclGroupEnd());
    }
    auto req = finish(stream);
    if (check_tags_) req->check_tag(mpi_comm_, peer, tag, /*is_recv=*/true);
    return req;
  }

  RequestPtr iallreduce(Tensor& t, ReduceOp op) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_device_tensor(t, "iallreduce");
    after_compute(coll_stream_);
    const ncclRedOp_t nop = op == ReduceOp::sum ? ncclSum : op == ReduceOp::max ? ncclMax : ncclMin;
    if (t.numel() > 0)
      NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t), nop, group_comm_,
                               coll_stream_));
    return finish(coll_stream_);
  }

  RequestPtr ireduce_scatter_sum(const Tensor& in, Tensor& out) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_device_tensor(in, "ireduce_scatter_sum");
    check_device_tensor(out, "ireduce_scatter_sum");
    RELAY_ASSERT(in.numel() == out.numel() * size_, "reduce-scatter of " << in.numel() << " into " << out.numel());
    after_compute(coll_stream_);
    if (out.numel() > 0)
      NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()), nccl_type(in), ncclSum,
                                   group_comm_, coll_stream_));
    return finish(coll_stream_);
  }

  RequestPtr iallgather(Tensor& buf) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_device_tensor(buf, "iallgather");
    RELAY_ASSERT(buf.numel() % size_ == 0, "all-gather of " << buf.numel() << " over " << size_);
    after_compute(coll_stream_);
    const size_t count = static_cast<size_t>(buf.numel() / size_);
    if (count > 0) {  // in place: this rank's part already sits at rank * count
      const Tensor mine = buf.rows(static_cast<int64_t>(count) * rank_, static_cast<int64_t>(count));
      NCCL_CHECK(ncclAllGather(mine.raw(), buf.raw(), count, nccl_type(buf), group_comm_, coll_stream_));
    }
    return finish(coll_stream_);
  }

  // Stream-ordered: later compute work sees the broadcast data; the host does not wait.
  void broadcast(Tensor& t, int root) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_device_tensor(t, "broadcast");
    RELAY_ASSERT(root >= 0 && root < size_, "broadcast: root " << root << " of " << size_ << " ranks");
    after_compute(coll_stream_);
    if (t.numel() > 0)
      NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_type(t), root, group_comm_,
                               coll_stream_));
    finish(coll_stream_)->wait();
  }

  // Grouped point-to-point over the group communicator (NCCL has no all-to-all-v): one ncclSend and one ncclRecv per
  // member, then the host waits (the counts that follow depend on it).
  void alltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                     const std::vector<int64_t>& recv_rows, const std::string& what) override {
    CUDA_CHECK(cudaSetDevice(device_));
    check_device_tensor(send, "alltoall_rows");
    check_device_tensor(recv, "alltoall_rows");
    RELAY_ASSERT(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_, "all-to-all counts of another group");
    const int64_t width = send.size(0) > 0 ? send.numel() / send.size(0) : recv.numel() / std::max<int64_t>(recv.size(0), 1);
    after_compute(coll_stream_);
    NCCL_CHECK(ncclGroupStart());
    int64_t s_at = 0, r_at = 0;
    for (int p = 0; p < size_; ++p) {
      const int64_t sn = send_rows[size_t(p)], rn = recv_rows[size_t(p)];
      if (sn) NCCL_CHECK(ncclSend(send.rows(s_at, sn).raw(), size_t(sn * width), nccl_type(send), p, group_comm_, coll_stream_));
      if (rn) NCCL_CHECK(ncclRecv(recv.rows(r_at, rn).raw(), size_t(rn * width), nccl_type(recv), p, group_comm_, coll_stream_));
      s_at += sn;
      r_at += rn;
    }
    NCCL_CHECK(ncclGroupEnd());
    auto req = finish(coll_stream_);
    req->what = what;
    req->wait();
  }

  void alltoall_host(const int64_t* send, int64_t* recv, int count, const std::string& what) override {
    host_alltoall(mpi_comm_, send, recv, count, what);
  }

  void allreduce_host(double* values, int count, ReduceOp op, const std::string& what) override {
    if (count == 0) return;
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, mpi_op(op), mpi_comm_, &req));
    watchdog_wait(&req, what);
  }

  void gather_f64(const double* mine, int count, double* all, int root, const std::string& what) override {
    MPI_Request req;
    MPI_CHECK(MPI_Igather(mine, count, MPI_DOUBLE, all, count, MPI_DOUBLE, root, mpi_comm_, &req));
    watchdog_wait(&req, what);
  }

  // Host-side only, like MPI_Barrier: synchronize the backend first to include GPU work.
  void barrier() override {
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(mpi_comm_, &req));
    watchdog_wait(&req, "a barrier");
  }

  // Host bytes travel over this communicator's private MPI duplicate, beside the NCCL traffic.
  std::vector<std::byte> gather_host(const void* data, size_t bytes, int root, std::vector<size_t>* sizes,
                                     const std::string& what) override {
    return host_gather(mpi_comm_, data, bytes, root, sizes, what);
  }
  void send_host(const void* data, size_t bytes, int peer, int tag, const std::string& what) override {
    host_send(mpi_comm_, data, bytes, peer, tag, world_rank_in(mpi_comm_, peer), what);
  }
  void recv_host(void* data, size_t bytes, int peer, int tag, const std::string& what) override {
    host_recv(mpi_comm_, data, bytes, peer, tag, world_rank_in(mpi_comm_, peer), what);
  }

  // NCCL's side of the progress watchdog (PyTorch's ProcessGroupNCCL does the same): a thread polls
  // ncclCommGetAsyncError and this rank's progress; on an asynchronous NCCL error, or when the main
  // thread has made no progress for parallel.timeout plus a margin (it is stuck inside a GPU wait
  // behind an NCCL operation whose peer never comes, so it cannot answer the MPI watchdog), it aborts
  // the communicators: the pending operations fail, the main thread's CUDA check reports it and ends
  // the job through MPI_Abort.
  void start_watchdog() {
    Watchdog* wd = active_watchdog();
    if (!wd || wd->timeout() <= 0) return;
    const double limit = wd->timeout() + 30.0;
    watchdog_ = std::thread([this, wd, limit] {
      while (!stop_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::string why;
        std::vector<ncclComm_t> comms = {group_comm_};
        for (auto* v : {&send_comms_, &recv_comms_})
          for (ncclComm_t c : *v)
            if (c) comms.push_back(c);
        for (ncclComm_t c : comms) {
          ncclResult_t st = ncclSuccess;
          if (c && ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
            why = cat("NCCL reported an asynchronous error: ", ncclGetErrorString(st));
        }
        if (why.empty() && wd->seconds_since_progress() > limit)
          why = cat("made no progress for ", static_cast<long long>(wd->seconds_since_progress()),
                    " s inside NCCL communication at ", wd->context(), " (parallel.timeout = ", wd->timeout(), " s)");
        if (why.empty()) continue;
        print_error(cat("NCCL watchdog: ", why, "; aborting this rank's NCCL communicators"));
        for (ncclComm_t c : comms) ncclCommAbort(c);
        aborted_ = true;
        return;
      }
    });
  }

 private:
  // Calls f(peer, is_sender, comm) on this rank's pair communicators in the global order of
  // (lo, hi, direction) that every rank follows.
  template <typename F>
  void for_each_pair_comm(F&& f) {
    for (int lo = 0; lo < size_; ++lo)
      for (int hi = lo + 1; hi < size_; ++hi) {
        if (rank_ != lo && rank_ != hi) continue;
        const int peer = rank_ == lo ? hi : lo;
        for (int direction = 0; direction < 2; ++direction) {
          const bool is_sender = rank_ == (direction == 0 ? lo : hi);
          const auto p = static_cast<size_t>(peer);
          f(peer, is_sender, is_sender ? send_comms_[p] : recv_comms_[p]);
        }
      }
  }

  // One two-rank communicator per ordered pair, created in the global order above, so each blocking
  // step finds its partner: the lowest unfinished pair always has both members waiting on it. Each
  // is warmed up with a one-element message: NCCL connects a peer (all its point-to-point channels,
  // whatever the message size) inside the first ncclGroupEnd that uses it, and that blocks the host
  // until the peer connects too. Left to the first real message, a rank's first send would block
  // until its peer posted a receive, and two ranks that both send first would deadlock.
  void create_pair_comms() {
    float* token = nullptr;  // (1) scratch for the warm-up message
    CUDA_CHECK(cudaMalloc(&token, sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(token, 0, sizeof(float), coll_stream_));
    for_each_pair_comm([&](int peer, bool is_sender, ncclComm_t& comm) {
      ncclUniqueId id;
      if (is_sender) {
        NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Send(&id, sizeof(id), MPI_BYTE, peer, kIdTag, mpi_comm_));
      } else {
        MPI_CHECK(MPI_Recv(&id, sizeof(id), MPI_BYTE, peer, kIdTag, mpi_comm_, MPI_STATUS_IGNORE));
      }
      NCCL_CHECK(ncclCommInitRank(&comm, 2, id, is_sender ? 0 : 1));  // the sender is rank 0
      NCCL_CHECK(ncclGroupStart());
      if (is_sender)
        NCCL_CHECK(ncclSend(token, 1, ncclFloat32, 1, comm, coll_stream_));
      else
        NCCL_CHECK(ncclRecv(token, 1, ncclFloat32, 0, comm, coll_stream_));
      NCCL_CHECK(ncclGroupEnd());
      CUDA_CHECK(cudaStreamSynchronize(coll_stream_));
    });
    CUDA_CHECK(cudaFree(token));
  }

  void check_device_tensor(const Tensor& t, const char* op) const {
    RELAY_ASSERT(t.defined() && t.device() == Device::cuda,
                 op << ": tensor " << shape_str(t.shape()) << " is not on the GPU");
  }

  void check_p2p(const Tensor& t, int peer, const char* op) const {
    check_device_tensor(t, op);
    RELAY_ASSERT(peer >= 0 && peer < size_ && peer != rank_, op << ": peer " << peer << " (this is rank " << rank_
                                                                   << " of " << size_ << ")");
    RELAY_ASSERT(send_comms_[peer] && recv_comms_[peer],
                 op << ": this NCCL communicator was made without point-to-point support");
  }

  // Streams for a peer are made on first use, so only the peers a rank talks to take hardware queues.
  cudaStream_t p2p_stream(std::vector<cudaStream_t>& streams, int peer) {
    cudaStream_t& s = streams[static_cast<size_t>(peer)];
    if (!s) CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  // The communication stream waits for the compute work queued so far (the data producer).
  void after_compute(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream, ready_, 0));
  }

  std::unique_ptr<NcclRequest> finish(cudaStream_t stream) {
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream));
    return std::make_unique<NcclRequest>(done, compute_, device_);
  }

  bool check_tags_;
  MPI_Comm mpi_comm_ = MPI_COMM_NULL;  // a private duplicate: id exchange, tag checks, host reductions
  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t compute_ = nullptr;  // the backend's; not owned
  ncclComm_t group_comm_ = nullptr;
  cudaStream_t coll_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // reused: a stream wait captures the event's state when it is queued
  std::vector<ncclComm_t> send_comms_, recv_comms_;      // by peer: (me -> peer), (peer -> me)
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> aborted_{false};
  std::vector<cudaStream_t> send_streams_, recv_streams_;  // by peer, made on first use
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Backend& backend, bool point_to_point) {
  return std::make_unique<NcclCommunicator>(comm, backend, point_to_point);
}

}  // namespace relay
