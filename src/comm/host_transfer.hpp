// Host-memory transfers of raw bytes over an MPI communicator, every wait through the progress
// watchdog: the gathers behind reports, traces and checkpoints. Both communicators implement their
// Communicator::gather_host / send_host / recv_host with these (on GPUs these bytes travel over MPI).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace relay {

// Collective over comm: every member's `bytes` bytes of data to `root`, which returns them concatenated
// in rank order (others: empty) and, when sizes is given, each member's length (root only).
std::vector<std::byte> host_gather(MPI_Comm comm, const void* data, size_t bytes, int root,
                                   std::vector<size_t>* sizes, const std::string& what);
// Blocking point-to-point; messages larger than 1 GiB travel in 1 GiB pieces (MPI counts are int).
// world_peer: the other side's world rank, for the watchdog's message.
void host_send(MPI_Comm comm, const void* data, size_t bytes, int peer, int tag, int world_peer, const std::string& what);
void host_recv(MPI_Comm comm, void* data, size_t bytes, int peer, int tag, int world_peer, const std::string& what);

// Collective over comm: send (size x count int64s) block p to member p, recv block p from member p.
void host_alltoall(MPI_Comm comm, const int64_t* send, int64_t* recv, int count, const std::string& what);
// Collective over comm: rows of row_bytes bytes, send_rows[p] of send's (in member order) to member p, recv_rows[p]
// from member p into recv (in member order).
void host_alltoall_rows(MPI_Comm comm, const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, size_t row_bytes, const std::string& what);
// The same, started into req and not waited for: counts (4 x size ints: send counts and displacements, receive counts
// and displacements, in rows) must stay alive until req completes.
void host_ialltoall_rows(MPI_Comm comm, const void* send, const std::vector<int64_t>& send_rows, void* recv,
                         const std::vector<int64_t>& recv_rows, size_t row_bytes, std::vector<int>& counts,
                         MPI_Request* req);

// The world rank of member `rank` of comm.
int world_rank_in(MPI_Comm comm, int rank);

}  // namespace relay
