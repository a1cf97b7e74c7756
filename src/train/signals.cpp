#include "train/signals.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace relay {

namespace {
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the flag is also set from a signal handler");

extern "C" void on_stop_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}
}  // namespace

void catch_stop_signals() {
  // Only for a thread that unblocks them: set the flag there rather than die of the default action.
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // this thread, and every thread it makes from now on
  // Lives until the process ends (detached: it holds nothing and touches only the flag).
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) == 0) g_signal.store(sig, std::memory_order_relaxed);
    }
  }).detach();
}

bool stop_requested() { return g_signal.load(std::memory_order_relaxed) != 0; }
int stop_signal() { return g_signal.load(std::memory_order_relaxed); }

}  // namespace relay
