#include "comm/mpi_communicator.hpp"

#include <functional>
#include <memory>
#include <vector>

#include "comm/host_pool.hpp"
#include "comm/host_transfer.hpp"
#include "comm/mpi_check.hpp"
#include "comm/progress.hpp"
#include "comm/reduce_scatter.hpp"
#include "comm/watchdog.hpp"

namespace relay {

namespace {

// MPI has no bfloat16: it travels as 16-bit words (never as float), and sums go through a user
// reduction that adds in float and rounds each partial sum to bf16 (what an NCCL bf16 all-reduce does).
MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return MPI_UINT16_T;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return MPI_UINT8_T;  // moved as bytes (gathers); never summed (mpi_op_of)
  }
  return MPI_DATATYPE_NULL;
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_add(a[i], b[i]);
}

MPI_Op mpi_op_of(ReduceOp op, DType dt) {
  RELAY_ASSERT(!is_fp8(dt), "fp8 tensors are gathered and sent, never reduced");
  if (dt == DType::bf16) {
    RELAY_ASSERT(op == ReduceOp::sum, "bfloat16 reductions are sums only");
    static MPI_Op sum = [] {
      MPI_Op o;
      MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &o));
      return o;
    }();
    return sum;
  }
  return op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
}

// One pending MPI request; for device tensors a host staging buffer, uploaded on completion of a receive.
class MpiRequest final : public Request {
 public:
  // result_offset: where in staging the result starts (a collective's input may come first).
  MpiRequest(Backend& be, Tensor device_dst, std::vector<std::byte> staging, int peer = -1, size_t result_offset = 0)
      : be_(be), dst_(std::move(device_dst)), staging_(std::move(staging)), peer_(peer), offset_(result_offset) {}
  MPI_Request* handle() { return &req_; }
  void* staging() { return staging_.data() + offset_; }
  std::vector<int>& counts() { return counts_; }  // an all-to-all's counts and displacements, alive until done
  // Work on the received bytes once the request is done, in the thread that sees it done (before any upload): a
  // reduce-scatter's sum of the pieces (comm/reduce_scatter.hpp).
  void on_done(std::function<void()> f) { on_done_ = std::move(f); }
  // Host bytes the request owns until it is destroyed, not zeroed (a reduce-scatter's pieces: the exchange writes
  // them), from the process's pool (comm/host_pool.hpp: the same sizes come back every step, their pages already
  // faulted in) and returned to it with the request.
  std::byte* scratch(size_t bytes) {
    scratch_ = HostPool::take(bytes);
    return scratch_.get();
  }
  // Hands the started request to the job's progress thread, if there is one (parallel.overlap): from here on that
  // thread tests it, and this one only reads its completion flag.
  void hand_over() {
    if (ProgressThread* p = active_progress()) {
      flag_ = p->adopt(req_);
      req_ = MPI_REQUEST_NULL;
    }
  }
  // Started later by the progress thread (its lane): only the completion flag is this request's.
  void queued(ProgressThread::Done flag) { flag_ = std::move(flag); }
  void wait() override {
    if (done_) return;
    if (flag_) {
      const ProgressThread::Done f = flag_;
      ProgressThread* p = active_progress();
      if (p) p->waiting(true);
      watchdog_wait_until([f] { return f->load(std::memory_order_acquire); }, what, peer_);
      if (p) p->waiting(false);
    } else {
      watchdog_wait(&req_, what, peer_);
    }
    finish();
  }
  bool test() override {
    if (done_) return true;
    if (flag_) {
      if (flag_->load(std::memory_order_acquire)) finish();
      return done_;
    }
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    if (on_done_) on_done_();
    if (dst_.defined()) be_.upload(dst_, staging_.data() + offset_);
  }
  Backend& be_;
  Tensor dst_;  // defined only for staged receives / all-reduces
  std::vector<std::byte> staging_;
  int peer_;  // world rank of the other side, -1 for a collective
  size_t offset_ = 0;
  MPI_Request req_ = MPI_REQUEST_NULL;
  ProgressThread::Done flag_;  // set when the progress thread owns the request
  std::vector<int> counts_;
  std::function<void()> on_done_;
  HostPool::Block scratch_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Backend& backend) : comm_(comm), be_(backend) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Group group, world;
  MPI_CHECK(MPI_Comm_group(comm_, &group));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> mine(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) mine[static_cast<size_t>(i)] = i;
  world_rank_.resize(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Group_translate_ranks(group, size_, mine.data(), world, world_rank_.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
}

RequestPtr MpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(), world_rank_.at(static_cast<size_t>(peer)));
    MPI_CHECK(MPI_Isend(t.raw(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
    if (background_) r->hand_over();  // the tp ring of the collective matmul (model/collective_matmul.hpp)
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(t.bytes()), world_rank_.at(static_cast<size_t>(peer)));
  be_.download(r->staging(), t);
  MPI_CHECK(MPI_Isend(r->staging(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
  if (background_) r->hand_over();
  return r;
}

RequestPtr MpiCommunicator::irecv(Tensor& t, int peer, int tag) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(), world_rank_.at(static_cast<size_t>(peer)));
    MPI_CHECK(MPI_Irecv(t.raw(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
    if (background_) r->hand_over();
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, t, std::vector<std::byte>(t.bytes()), world_rank_.at(static_cast<size_t>(peer)));
  MPI_CHECK(MPI_Irecv(r->staging(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
  if (background_) r->hand_over();
  return r;
}

RequestPtr MpiCommunicator::iallreduce(Tensor& t, ReduceOp op) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
    r->what = "a gradient all-reduce";
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), count, mpi_type(t.dtype()), mpi_op_of(op, t.dtype()), comm_, r->handle()));
    if (background_) r->hand_over();
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, t, std::vector<std::byte>(t.bytes()));
  r->what = "a gradient all-reduce";
  be_.download(r->staging(), t);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, r->staging(), count, mpi_type(t.dtype()), mpi_op_of(op, t.dtype()), comm_, r->handle()));
  if (background_) r->hand_over();
  return r;
}

RequestPtr MpiCommunicator::ireduce_scatter_sum(const Tensor& in, Tensor& out) {
  RELAY_ASSERT(in.numel() == out.numel() * size_, "reduce-scatter of " << in.numel() << " into " << out.numel()
                                                                        << " x " << size_);
  RELAY_ASSERT(in.dtype() == out.dtype(), "reduce-scatter from " << dtype_name(in.dtype()) << " into "
                                                                  << dtype_name(out.dtype()));
  // The pieces' exchange, then their sum in libnbc's grouping (comm/reduce_scatter.hpp), done by the thread that sees
  // the exchange complete. The pieces (size x n) in the request's scratch; the sum straight into out (host) or into
  // the scratch's tail and uploaded (device, whose input is staged through the request's staging buffer).
  const int count = static_cast<int>(out.numel());
  const size_t all_bytes = in.bytes();
  const DType dt = in.dtype();
  const int size = size_;
  if (in.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
    r->what = "a gradient reduce-scatter";
    std::byte* pieces = r->scratch(all_bytes);
    void* dst = out.raw();
    r->on_done([pieces, dst, size, count, dt] { sum_pieces(pieces, dst, size, count, dt); });
    MPI_CHECK(MPI_Ialltoall(in.raw(), count, mpi_type(dt), pieces, count, mpi_type(dt), comm_, r->handle()));
    if (background_) r->hand_over();
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(all_bytes));
  r->what = "a gradient reduce-scatter";
  be_.download(r->staging(), in);
  std::byte* pieces = r->scratch(all_bytes + out.bytes());
  Backend* be = &be_;
  r->on_done([be, out, pieces, all_bytes, size, count, dt]() mutable {
    sum_pieces(pieces, pieces + all_bytes, size, count, dt);
    be->upload(out, pieces + all_bytes);
  });
  MPI_CHECK(MPI_Ialltoall(r->staging(), count, mpi_type(dt), pieces, count, mpi_type(dt), comm_, r->handle()));
  if (background_) r->hand_over();
  return r;
}

RequestPtr MpiCommunicator::iallgather(Tensor& buf) {
  RELAY_ASSERT(buf.numel() % size_ == 0, "all-gather of " << buf.numel() << " over " << size_);
  int count = static_cast<int>(buf.numel() / size_);
  if (buf.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
    r->what = "a parameter all-gather";
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.raw(), count, mpi_type(buf.dtype()), comm_,
                             r->handle()));
    if (background_) r->hand_over();
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, buf, std::vector<std::byte>(buf.bytes()));
  r->what = "a parameter all-gather";
  be_.download(r->staging(), buf);
  MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r->staging(), count, mpi_type(buf.dtype()), comm_,
                           r->handle()));
  if (background_) r->hand_over();
  return r;
}

RequestPtr MpiCommunicator::iallgather_in_turn(Tensor& buf) {
  ProgressThread* p = background_ ? active_progress() : nullptr;
  if (!p || buf.device() != Device::cpu) return iallgather(buf);
  RELAY_ASSERT(buf.numel() % size_ == 0, "all-gather of " << buf.numel() << " over " << size_);
  // Its own communicator: collectives on comm_ that the rank's thread starts meanwhile (a loss reduction, the next
  // bucket's) may not interleave with these in another order on another member. The first call makes it (every
  // member makes its first in-turn call at the same point).
  if (lane_ == MPI_COMM_NULL) MPI_CHECK(MPI_Comm_dup(comm_, &lane_));
  auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
  r->what = "a parameter all-gather";
  void* data = buf.raw();
  const int count = static_cast<int>(buf.numel() / size_);
  const MPI_Datatype type = mpi_type(buf.dtype());
  const MPI_Comm lane = lane_;
  r->queued(p->enqueue([data, count, type, lane] {
    MPI_Request q;
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, count, type, lane, &q));
    return q;
  }));
  return r;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (lane_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&lane_);
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(t.raw(), count, mpi_type(t.dtype()), root, comm_, &req));
    watchdog_wait(&req, "a broadcast");
    return;
  }
  std::vector<std::byte> host(t.bytes());
  if (rank_ == root) be_.download(host.data(), t);
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(host.data(), count, mpi_type(t.dtype()), root, comm_, &req));
  watchdog_wait(&req, "a broadcast");
  if (rank_ != root) be_.upload(t, host.data());
}

// An all-to-all of rows: its counts checked against the group and the tensors; the bytes of a row and the rows sent
// and received in all.
MpiCommunicator::RowsExchange MpiCommunicator::check_rows_exchange(const Tensor& send, const std::vector<int64_t>& send_rows,
                                                                   const Tensor& recv,
                                                                   const std::vector<int64_t>& recv_rows) const {
  RELAY_ASSERT(int(send_rows.size()) == size_ && int(recv_rows.size()) == size_, "all-to-all counts of another group");
  RELAY_ASSERT(send.dtype() == recv.dtype(), "all-to-all between dtypes");
  RowsExchange x;
  x.row_bytes = send.size(0) > 0 ? send.bytes() / size_t(send.size(0)) : recv.bytes() / size_t(std::max<int64_t>(recv.size(0), 1));
  for (int p = 0; p < size_; ++p) x.send_total += send_rows[size_t(p)], x.recv_total += recv_rows[size_t(p)];
  RELAY_ASSERT(x.send_total <= send.size(0) && x.recv_total <= recv.size(0), "all-to-all rows beyond the tensors");
  return x;
}

void MpiCommunicator::alltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                                    const std::vector<int64_t>& recv_rows, const std::string& what) {
  const RowsExchange x = check_rows_exchange(send, send_rows, recv, recv_rows);
  const size_t row_bytes = x.row_bytes;
  const int64_t s_total = x.send_total, r_total = x.recv_total;
  if (send.device() == Device::cpu) {
    host_alltoall_rows(comm_, send.raw(), send_rows, recv.raw(), recv_rows, row_bytes, what);
    return;
  }
  // Staged through host memory: only the rows that travel.
  std::vector<std::byte> out(size_t(s_total) * row_bytes), in(size_t(r_total) * row_bytes);
  if (s_total) be_.download(out.data(), send.rows(0, s_total));
  host_alltoall_rows(comm_, out.data(), send_rows, in.data(), recv_rows, row_bytes, what);
  if (r_total) {
    Tensor dst = recv.rows(0, r_total);
    be_.upload(dst, in.data());
  }
}

RequestPtr MpiCommunicator::ialltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                                           const std::vector<int64_t>& recv_rows, const std::string& what) {
  const RowsExchange x = check_rows_exchange(send, send_rows, recv, recv_rows);
  const size_t row_bytes = x.row_bytes;
  const int64_t s_total = x.send_total, r_total = x.recv_total;
  if (send.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
    r->what = what;
    host_ialltoall_rows(comm_, send.raw(), send_rows, recv.raw(), recv_rows, row_bytes, r->counts(), r->handle());
    if (background_) r->hand_over();
    return r;
  }
  // Staged through host memory (the rows that travel: out, then in), uploaded into recv when done.
  const size_t out_bytes = size_t(s_total) * row_bytes;
  auto r = std::make_unique<MpiRequest>(be_, r_total ? recv.rows(0, r_total) : Tensor(),
                                        std::vector<std::byte>(out_bytes + size_t(r_total) * row_bytes), -1, out_bytes);
  r->what = what;
  std::byte* out = static_cast<std::byte*>(r->staging()) - out_bytes;
  if (s_total) be_.download(out, send.rows(0, s_total));
  host_ialltoall_rows(comm_, out, send_rows, r->staging(), recv_rows, row_bytes, r->counts(), r->handle());
  if (background_) r->hand_over();
  return r;
}

void MpiCommunicator::alltoall_host(const int64_t* send, int64_t* recv, int count, const std::string& what) {
  host_alltoall(comm_, send, recv, count, what);
}

void MpiCommunicator::allreduce_host(double* values, int count, ReduceOp op, const std::string& what) {
  MPI_Op mop = mpi_op_of(op, DType::f32);
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, mop, comm_, &req));
  watchdog_wait(&req, what);
}

void MpiCommunicator::gather_f64(const double* mine, int count, double* all, int root, const std::string& what) {
  MPI_Request req;
  MPI_CHECK(MPI_Igather(mine, count, MPI_DOUBLE, all, count, MPI_DOUBLE, root, comm_, &req));
  watchdog_wait(&req, what);
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(comm_, &req));
  watchdog_wait(&req, "a barrier");
}

std::vector<std::byte> MpiCommunicator::gather_host(const void* data, size_t bytes, int root,
                                                    std::vector<size_t>* sizes, const std::string& what) {
  return host_gather(comm_, data, bytes, root, sizes, what);
}

void MpiCommunicator::send_host(const void* data, size_t bytes, int peer, int tag, const std::string& what) {
  host_send(comm_, data, bytes, peer, tag, world_rank_.at(static_cast<size_t>(peer)), what);
}

void MpiCommunicator::recv_host(void* data, size_t bytes, int peer, int tag, const std::string& what) {
  host_recv(comm_, data, bytes, peer, tag, world_rank_.at(static_cast<size_t>(peer)), what);
}

}  // namespace relay
