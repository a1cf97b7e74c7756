// Fatal-error path shared by every CHECK macro: one line, the rank and host, then the whole job ends.
#include "core/error.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace relay {
namespace {
int g_rank = -1;
std::string g_host;
}  // namespace

void set_process_identity(int rank, const std::string& host) {
  g_rank = rank;
  g_host = host;
}
int process_rank() { return g_rank; }
std::string process_prefix() {
  if (g_rank < 0) return "";
  return cat("[rank ", g_rank, (g_host.empty() ? "" : " on " + g_host), "] ");
}

void fatal(const std::string& what, const char* file, int line, const char* hint) {
  std::fprintf(stderr, "%sfatal: %s (%s:%d)\n", process_prefix().c_str(), what.c_str(), file, line);
  if (hint) std::fprintf(stderr, "%shint: %s\n", process_prefix().c_str(), hint);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

}  // namespace relay
