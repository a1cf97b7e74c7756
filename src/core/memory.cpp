#include "core/memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace relay {

namespace {
thread_local MemKind current = MemKind::other;
constexpr int kKinds = static_cast<int>(MemKind::count);
std::atomic<int64_t> held[kKinds];
std::atomic<int64_t> peak[kKinds];
}  // namespace

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::params: return "params";
    case MemKind::grads: return "grads";
    case MemKind::optimizer: return "optimizer";
    case MemKind::activations: return "activations";
    default: return "other";
  }
}

MemoryScope::MemoryScope(MemKind k) : prev_(current) { current = k; }
MemoryScope::~MemoryScope() { current = prev_; }
MemKind current_mem_kind() { return current; }

void mem_account(MemKind k, int64_t bytes) {
  const int i = static_cast<int>(k);
  const int64_t now = held[i].fetch_add(bytes) + bytes;
  int64_t p = peak[i].load();
  while (now > p && !peak[i].compare_exchange_weak(p, now)) {
  }
}

int64_t mem_bytes(MemKind k) { return held[static_cast<int>(k)].load(); }
int64_t mem_peak_bytes(MemKind k) { return peak[static_cast<int>(k)].load(); }
void mem_reset_peaks() {
  for (int i = 0; i < static_cast<int>(MemKind::count); ++i) peak[i].store(held[i].load());
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / (1024.0 * 1024.0));
  return buf;
}

}  // namespace relay
