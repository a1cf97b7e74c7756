// Host blocks for the MPI communicator's requests, kept across steps (issue 40: the shaped-link overlap bench).
// A reduce-scatter's pieces (size x count, the whole bucket) were a fresh allocation each call: glibc hands blocks
// of tens of MiB out as new mappings, so every step the transfer faulted in and zeroed every page it wrote
// (perf on dp 2 ZeRO-1 over the shaped link: clear_page and the fault path ~4% of both cores, the receiving
// thread's and the all-to-all's own-block copy's), beside the rank's compute. The pool hands a returned block of the
// same size back instead (a step's buckets repeat their sizes), keeping at most kKeepBytes of idle blocks per process;
// beyond that a returned block is freed. Thread-safe: a request may be destroyed on any thread.
#pragma once
#include <cstddef>
#include <memory>

namespace relay {

class HostPool {
 public:
  static constexpr size_t kKeepBytes = size_t{1} << 30;  // idle blocks kept at most, all sizes together
  struct Free {
    size_t bytes;
    void operator()(std::byte* p) const;
  };
  using Block = std::unique_ptr<std::byte[], Free>;
  // A block of exactly `bytes` (not zeroed): an idle one of that size if the pool holds one, else a new one.
  static Block take(size_t bytes);
  static size_t idle_bytes();  // what the pool holds now (tests)
};

}  // namespace relay
