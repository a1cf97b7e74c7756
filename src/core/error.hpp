// Errors: user mistakes are relay::Error exceptions caught once in main; library failures go
// through CHECK macros that name the call, file:line and the library's message, then end the job.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace relay {

// A user-facing error: bad config, bad data, bad checkpoint. The message names the key, file,
// tensor and the expected vs actual value. Caught once in main and printed with the rank prefix.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// An error that every rank has agreed on (see comm/agree.hpp); the rank that saw it has printed it.
class AgreedError : public Error {
 public:
  explicit AgreedError(const std::string& msg) : Error(msg) {}
};

// Builds a message from stream pieces: throw Error(cat("key '", k, "' must be > 0, got ", v));
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Identity of this process for error prefixes ("[rank 3 on node17]"); set once MPI is up.
void set_process_identity(int rank, const std::string& host);
int process_rank();                   // -1 before MPI is initialised
std::string process_prefix();         // "[rank N] " or "" before MPI

// Prints "<prefix>fatal: <what> at file:line" plus an optional hint and ends the whole job
// (MPI_Abort when MPI is running, exit(1) otherwise). Never returns.
[[noreturn]] void fatal(const std::string& what, const char* file, int line, const char* hint = nullptr);

}  // namespace relay

// Internal invariants (bugs, not user mistakes): msg is a stream expression.
#define RELAY_ASSERT(cond, msg)                                                  \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::ostringstream relay_assert_os_;                                       \
      relay_assert_os_ << "internal check failed: " #cond ": " << msg;           \
      ::relay::fatal(relay_assert_os_.str(), __FILE__, __LINE__);                \
    }                                                                            \
  } while (0)
