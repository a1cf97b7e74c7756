// Communicator over an MPI communicator. Host tensors are sent in place; device tensors (CUDA with
// parallel.comm = "mpi") are staged through host buffers, so several ranks can share one GPU.
#pragma once
#include <mpi.h>

#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"

namespace relay {

class MpiCommunicator final : public Communicator {
 public:
  // Does not take ownership of comm.
  MpiCommunicator(MPI_Comm comm, Backend& backend);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  void set_background_progress(bool on) override { background_ = on; }

  RequestPtr isend(const Tensor& t, int peer, int tag) override;
  RequestPtr irecv(Tensor& t, int peer, int tag) override;
  RequestPtr iallreduce(Tensor& t, ReduceOp op) override;
  RequestPtr ireduce_scatter_sum(const Tensor& in, Tensor& out) override;
  RequestPtr iallgather(Tensor& buf) override;
  RequestPtr iallgather_in_turn(Tensor& buf) override;
  void broadcast(Tensor& t, int root) override;
  void alltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                     const std::vector<int64_t>& recv_rows, const std::string& what) override;
  RequestPtr ialltoall_rows(const Tensor& send, const std::vector<int64_t>& send_rows, Tensor& recv,
                            const std::vector<int64_t>& recv_rows, const std::string& what) override;
  void alltoall_host(const int64_t* send, int64_t* recv, int count, const std::string& what) override;
  void allreduce_host(double* values, int count, ReduceOp op, const std::string& what = "a host reduction") override;
  void gather_f64(const double* mine, int count, double* all, int root, const std::string& what) override;
  void barrier() override;
  std::vector<std::byte> gather_host(const void* data, size_t bytes, int root, std::vector<size_t>* sizes,
                                     const std::string& what) override;
  void send_host(const void* data, size_t bytes, int peer, int tag, const std::string& what) override;
  void recv_host(void* data, size_t bytes, int peer, int tag, const std::string& what) override;

 private:
  struct RowsExchange {
    size_t row_bytes = 0;
    int64_t send_total = 0, recv_total = 0;
  };
  RowsExchange check_rows_exchange(const Tensor& send, const std::vector<int64_t>& send_rows, const Tensor& recv,
                                   const std::vector<int64_t>& recv_rows) const;
  MPI_Comm comm_;
  Backend& be_;
  int rank_ = 0, size_ = 1;
  bool background_ = false;  // set_background_progress
  std::vector<int> world_rank_;  // of each member, for the watchdog's messages
  MPI_Comm lane_ = MPI_COMM_NULL;  // a duplicate of comm_ for the in-turn gathers (the progress thread's lane only)
};

}  // namespace relay
