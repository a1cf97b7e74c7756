#include "comm/agree.hpp"

#include <cstdio>
#include <string>

#include "comm/mpi_check.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace relay {

void print_error(const std::string& msg) {
  std::fprintf(stderr, "%serror: %s\n", process_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
}

void agree_on_errors(MPI_Comm comm, const std::function<void()>& phase) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  std::string message;
  bool agreed = false;
  try {
    phase();
  } catch (const AgreedError& e) {
    message = e.what();
    agreed = true;
  } catch (const Error& e) {
    message = e.what();
  }
  int mine = message.empty() ? size : rank, first = size;
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, &req));
  watchdog_wait(&req, "the other ranks to finish setting up");
  if (first == size) return;
  if (first == rank && !agreed) print_error(message);
  throw AgreedError(message.empty() ? "another rank failed" : message);
}

}  // namespace relay
