// MPI_CHECK: every MPI call's error code turned into one fatal line with the rank and MPI's message.
#pragma once
#include <mpi.h>

#include "core/error.hpp"

namespace relay {
inline void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fatal(cat(call, " failed: ", std::string(msg, static_cast<size_t>(len))), file, line);
}
}  // namespace relay

#define MPI_CHECK(call) ::relay::mpi_check((call), #call, __FILE__, __LINE__)
