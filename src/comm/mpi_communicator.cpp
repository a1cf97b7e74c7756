#include "comm/mpi_communicator.hpp"

#include <vector>

#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"

namespace relay {

namespace {

MPI_Datatype mpi_type(DType dt) { return dt == DType::f32 ? MPI_FLOAT : MPI_INT32_T; }

// One pending MPI request; for device tensors a host staging buffer, uploaded on completion of a receive.
class MpiRequest final : public Request {
 public:
  MpiRequest(Backend& be, Tensor device_dst, std::vector<std::byte> staging, int peer = -1)
      : be_(be), dst_(std::move(device_dst)), staging_(std::move(staging)), peer_(peer) {}
  MPI_Request* handle() { return &req_; }
  void* staging() { return staging_.data(); }
  void wait() override {
    if (done_) return;
    watchdog_wait(&req_, what, peer_);
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    if (dst_.defined()) be_.upload(dst_, staging_.data());
  }
  Backend& be_;
  Tensor dst_;  // defined only for staged receives / all-reduces
  std::vector<std::byte> staging_;
  int peer_;  // world rank of the other side, -1 for a collective
  MPI_Request req_ = MPI_REQUEST_NULL;
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
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(t.bytes()), world_rank_.at(static_cast<size_t>(peer)));
  be_.download(r->staging(), t);
  MPI_CHECK(MPI_Isend(r->staging(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
  return r;
}

RequestPtr MpiCommunicator::irecv(Tensor& t, int peer, int tag) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>(), world_rank_.at(static_cast<size_t>(peer)));
    MPI_CHECK(MPI_Irecv(t.raw(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, t, std::vector<std::byte>(t.bytes()), world_rank_.at(static_cast<size_t>(peer)));
  MPI_CHECK(MPI_Irecv(r->staging(), count, mpi_type(t.dtype()), peer, tag, comm_, r->handle()));
  return r;
}

RequestPtr MpiCommunicator::iallreduce_sum(Tensor& t) {
  int count = static_cast<int>(t.numel());
  if (t.device() == Device::cpu) {
    auto r = std::make_unique<MpiRequest>(be_, Tensor(), std::vector<std::byte>());
    r->what = "a gradient all-reduce";
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), count, mpi_type(t.dtype()), MPI_SUM, comm_, r->handle()));
    return r;
  }
  auto r = std::make_unique<MpiRequest>(be_, t, std::vector<std::byte>(t.bytes()));
  r->what = "a gradient all-reduce";
  be_.download(r->staging(), t);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, r->staging(), count, mpi_type(t.dtype()), MPI_SUM, comm_, r->handle()));
  return r;
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

void MpiCommunicator::allreduce_host(double* values, int count, ReduceOp op, const std::string& what) {
  MPI_Op mop = op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, mop, comm_, &req));
  watchdog_wait(&req, what);
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(comm_, &req));
  watchdog_wait(&req, "a barrier");
}

}  // namespace relay
