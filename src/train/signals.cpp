#include "train/signals.hpp"

#include <csignal>

namespace relay {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking MPI and HDF5 calls carry on; the flag is read between steps
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool stop_requested() { return g_signal != 0; }
int stop_signal() { return g_signal; }

}  // namespace relay
