// What this rank's tensors hold, by kind: every Tensor allocation is counted under the kind of the
// innermost MemoryScope alive when it was made (parameters, gradients, optimizer state, activations,
// other) until its storage is freed. Bytes are the tensors' own sizes (shape x dtype). The trainer
// reports them per rank after the first step beside `relay plan`'s prediction (train/memory_plan.hpp).
#pragma once
#include <cstdint>
#include <string>

namespace relay {

enum class MemKind : int { other = 0, params, grads, optimizer, activations, count };
const char* mem_kind_name(MemKind k);  // "params", "grads", "optimizer", "activations", "other"

class MemoryScope {
 public:
  explicit MemoryScope(MemKind k);
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemKind prev_;
};

MemKind current_mem_kind();
void mem_account(MemKind k, int64_t bytes);  // + on allocation, - when freed
int64_t mem_bytes(MemKind k);                 // held now
int64_t mem_peak_bytes(MemKind k);            // the most held at once so far
void mem_reset_peaks();                       // from now on: peaks count from what is held now

std::string mib(double bytes);  // "12.3": bytes as MiB with one decimal, for the plan's and the run's tables

}  // namespace relay
