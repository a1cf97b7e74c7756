// Stop signals (train/signals.hpp): SIGUSR1 and SIGTERM set the stop flag from a thread of their own;
// the threads that compute or communicate, made after catch_stop_signals(), are never interrupted.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "train/signals.hpp"

namespace relay {
namespace {

bool blocks_stop_signals() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, SIGUSR1) == 1 && sigismember(&now, SIGTERM) == 1;
}

// Sleeps `s` seconds in one nanosleep, which a signal handler run in this thread would cut short
// (EINTR whatever SA_RESTART says). Returns the call's errno, 0 when it slept undisturbed.
int sleep_once(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  return nanosleep(&ts, nullptr) == 0 ? 0 : errno;
}

bool wait_for_flag(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!stop_requested() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return stop_requested();
}

// One process, one test: the flag, once set, stays set.
TEST(StopSignals, TakenByTheirOwnThreadNeverByAWorkingOne) {
  catch_stop_signals();
  EXPECT_TRUE(blocks_stop_signals()) << "the calling thread must block SIGUSR1 and SIGTERM";
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop_signal(), 0);

  // A thread made afterwards (as MPI's, the prefetcher and the checkpoint writer are) inherits the block
  // and sleeps through a process-directed SIGUSR1, as does this one.
  bool worker_blocks = false;
  int worker_errno = -1;
  std::thread worker([&] {
    worker_blocks = blocks_stop_signals();
    worker_errno = sleep_once(1.0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  const int main_errno = sleep_once(0.5);
  worker.join();
  EXPECT_TRUE(worker_blocks) << "a thread made after catch_stop_signals() must block the stop signals";
  EXPECT_EQ(worker_errno, 0) << "the worker's sleep was interrupted (EINTR): the signal ran in a working thread";
  EXPECT_EQ(main_errno, 0) << "the main thread's sleep was interrupted (EINTR): the signal ran in it";
  ASSERT_TRUE(wait_for_flag(5.0)) << "SIGUSR1 did not set the stop flag within 5 s";
  EXPECT_EQ(stop_signal(), SIGUSR1);

  // SIGTERM is taken the same way; the flag names the latest signal.
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (stop_signal() != SIGTERM && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(stop_signal(), SIGTERM) << "SIGTERM did not reach the stop flag (the process is still alive)";
}

}  // namespace
}  // namespace relay
