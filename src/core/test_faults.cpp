// Test-only fault injection at named collectives (core/test_faults.hpp): one armed site per process, fired once.
#include "core/test_faults.hpp"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace relay {

namespace {
std::string g_site;              // written once by arm_test_fault, before any collective of the step starts
std::atomic<int> g_signal{0};    // 0: disarmed (or already fired)
}  // namespace

bool arm_test_fault() {
  const char* where = std::getenv("RELAY_TEST_KILL_WHERE");
  const std::string w = where ? where : "";
  const size_t dash = w.rfind('-');
  if (dash == std::string::npos || dash == 0) return false;
  const std::string how = w.substr(dash + 1);
  const int sig = how == "stop" ? SIGSTOP : how == "kill" ? SIGKILL : 0;
  if (!sig) return false;
  g_site = w.substr(0, dash);
  g_signal.store(sig);
  return true;
}

void test_fault_point(const char* site) {
  if (g_signal.load(std::memory_order_relaxed) == 0 || g_site != site) return;
  if (const int sig = g_signal.exchange(0)) std::raise(sig);
}

}  // namespace relay
