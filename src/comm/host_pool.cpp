// The process's pool of idle host blocks for communication requests (comm/host_pool.hpp).
#include "comm/host_pool.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace relay {

namespace {
struct Pool {
  std::mutex mu;
  std::vector<std::pair<size_t, std::byte*>> idle;  // (bytes, block), oldest first
  size_t idle_bytes = 0;
};
Pool& pool() {  // never destroyed: a request may be returned during the process's exit, after static destructors
  static Pool* p = new Pool;
  return *p;
}
}  // namespace

void HostPool::Free::operator()(std::byte* p) const {
  if (!p) return;
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    // Make room by freeing the oldest idle blocks; a block larger than the whole allowance is not kept.
    if (bytes <= kKeepBytes) {
      while (pl.idle_bytes + bytes > kKeepBytes && !pl.idle.empty()) {
        pl.idle_bytes -= pl.idle.front().first;
        delete[] pl.idle.front().second;
        pl.idle.erase(pl.idle.begin());
      }
      pl.idle.emplace_back(bytes, p);
      pl.idle_bytes += bytes;
      return;
    }
  }
  delete[] p;
}

HostPool::Block HostPool::take(size_t bytes) {
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lock(pl.mu);
    auto it = std::find_if(pl.idle.rbegin(), pl.idle.rend(), [bytes](const auto& e) { return e.first == bytes; });
    if (it != pl.idle.rend()) {
      std::byte* p = it->second;
      pl.idle_bytes -= bytes;
      pl.idle.erase(std::next(it).base());
      return Block(p, Free{bytes});
    }
  }
  return Block(new std::byte[bytes], Free{bytes});
}

size_t HostPool::idle_bytes() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().idle_bytes;
}

}  // namespace relay
