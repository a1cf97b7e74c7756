#include "comm/host_transfer.hpp"

#include <algorithm>
#include <limits>

#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace relay {

namespace {
constexpr size_t kPiece = size_t(1) << 30;  // bytes per MPI message of a large send
}

std::vector<std::byte> host_gather(MPI_Comm comm, const void* data, size_t bytes, int root,
                                   std::vector<size_t>* sizes, const std::string& what) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  RELAY_ASSERT(bytes <= size_t(std::numeric_limits<int>::max()), "a gather of " << bytes << " bytes per rank");
  const int n = static_cast<int>(bytes);
  std::vector<int> counts(rank == root ? static_cast<size_t>(size) : 0), displs(counts.size());  // (size)
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm, &req));
  watchdog_wait(&req, what);
  size_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] = static_cast<int>(total);
    total += static_cast<size_t>(counts[i]);
  }
  RELAY_ASSERT(total <= size_t(std::numeric_limits<int>::max()), "a gather of " << total << " bytes");
  std::vector<std::byte> all(total);  // (total) bytes, rank order
  MPI_CHECK(MPI_Igatherv(data, n, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, root, comm, &req));
  watchdog_wait(&req, what);
  if (sizes) sizes->assign(counts.begin(), counts.end());
  return all;
}

void host_send(MPI_Comm comm, const void* data, size_t bytes, int peer, int tag, int world_peer, const std::string& what) {
  const auto* p = static_cast<const std::byte*>(data);
  for (size_t at = 0; at < bytes || at == 0; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, bytes - at));
    MPI_Request req;
    MPI_CHECK(MPI_Isend(p + at, n, MPI_BYTE, peer, tag, comm, &req));
    watchdog_wait(&req, what, world_peer);
    if (bytes == 0) break;
  }
}

void host_recv(MPI_Comm comm, void* data, size_t bytes, int peer, int tag, int world_peer, const std::string& what) {
  auto* p = static_cast<std::byte*>(data);
  for (size_t at = 0; at < bytes || at == 0; at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, bytes - at));
    MPI_Request req;
    MPI_CHECK(MPI_Irecv(p + at, n, MPI_BYTE, peer, tag, comm, &req));
    watchdog_wait(&req, what, world_peer);
    if (bytes == 0) break;
  }
}

void host_alltoall(MPI_Comm comm, const int64_t* send, int64_t* recv, int count, const std::string& what) {
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoall(send, count, MPI_INT64_T, recv, count, MPI_INT64_T, comm, &req));
  watchdog_wait(&req, what);
}

void host_ialltoall_rows(MPI_Comm comm, const void* send, const std::vector<int64_t>& send_rows, void* recv,
                         const std::vector<int64_t>& recv_rows, size_t row_bytes, std::vector<int>& counts,
                         MPI_Request* req) {
  // Counts in rows of one contiguous type (row_bytes bytes), so a peer's share may exceed 2 GiB.
  const size_t n = send_rows.size();
  counts.assign(4 * n, 0);
  int* sc = counts.data();  // (4, size) send counts, send displacements, receive counts, receive displacements
  int *sd = sc + n, *rc = sd + n, *rd = rc + n;
  int64_t s_at = 0, r_at = 0;
  for (size_t p = 0; p < n; ++p) {
    RELAY_ASSERT(s_at <= std::numeric_limits<int>::max() && r_at <= std::numeric_limits<int>::max(),
                 "an all-to-all of more than 2^31 rows");
    sc[p] = int(send_rows[p]), sd[p] = int(s_at), rc[p] = int(recv_rows[p]), rd[p] = int(r_at);
    s_at += send_rows[p];
    r_at += recv_rows[p];
  }
  RELAY_ASSERT(row_bytes <= size_t(std::numeric_limits<int>::max()), "rows of " << row_bytes << " bytes");
  MPI_Datatype row;
  MPI_CHECK(MPI_Type_contiguous(int(row_bytes), MPI_BYTE, &row));
  MPI_CHECK(MPI_Type_commit(&row));
  MPI_CHECK(MPI_Ialltoallv(send, sc, sd, row, recv, rc, rd, row, comm, req));
  MPI_Type_free(&row);  // a pending operation keeps using it (MPI 4.0, 5.1.9)
}

void host_alltoall_rows(MPI_Comm comm, const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, size_t row_bytes, const std::string& what) {
  std::vector<int> counts;
  MPI_Request req;
  host_ialltoall_rows(comm, send, send_rows, recv, recv_rows, row_bytes, counts, &req);
  watchdog_wait(&req, what);
}

int world_rank_in(MPI_Comm comm, int rank) {
  MPI_Group group, world;
  MPI_CHECK(MPI_Comm_group(comm, &group));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int out = MPI_UNDEFINED;
  MPI_CHECK(MPI_Group_translate_ranks(group, 1, &rank, world, &out));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

}  // namespace relay
