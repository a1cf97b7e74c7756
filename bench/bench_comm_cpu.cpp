// What communication alone costs in CPU (issue 40: on a 2-core machine the overlapped collective's CPU work competes
// with the compute it hides behind). On 2 ranks: REPS all-reduces of MIB MiB of f32 started through src/comm and
// advanced by the progress thread (comm/progress.hpp, poll POLL_US), the rank's own thread sleeping 1 ms between
// tests as if it computed; per rank its process's user and system CPU seconds (getrusage), rank 0 the machine's
// softirq seconds and NET_RX/NET_TX softirq counts from /proc (system wide: run it on a quiet machine, or read the
// softirq figures as ours only because nothing else on it uses the network). Measures; never fails.
// POLL_US / MAX_POLL_US: the progress thread's first pause and the most it backs off to (equal: a fixed interval).
// Usage: mpirun -np 2 bench_comm_cpu [MIB (64)] [REPS (4)] [POLL_US (50)] [MAX_POLL_US (1000)]
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "backend/cpu_backend.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/progress.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

using namespace relay;

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Cpu {
  double user = 0, sys = 0;
};
Cpu process_cpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6, u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6};
}

// The machine's softirq seconds (/proc/stat's "cpu" line, 7th field, in clock ticks).
double softirq_s() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  long long v[7] = {};
  f >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6];
  return static_cast<double>(v[6]) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The sum over CPUs of one /proc/softirqs row ("NET_RX:").
long long softirq_count(const std::string& row) {
  std::ifstream f("/proc/softirqs");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string name;
    in >> name;
    if (name != row) continue;
    long long sum = 0, x = 0;
    while (in >> x) sum += x;
    return sum;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double mib = argc > 1 ? std::atof(argv[1]) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 4;
  const int poll_us = argc > 3 ? std::atoi(argv[3]) : 50;
  const int max_poll_us = argc > 4 ? std::atoi(argv[4]) : 1000;
  CpuBackend be(1);
  cpu::set_threads(1);
  MpiCommunicator comm(MPI_COMM_WORLD, be);
  Tensor grads(be, {static_cast<int64_t>(mib * 1024 * 1024 / 4)});  // (N) f32: the "gradients"
  be.fill(grads, 1.f);
  ProgressThread progress(poll_us, max_poll_us);
  set_active_progress(&progress);
  comm.set_background_progress(true);
  comm.iallreduce_sum(grads)->wait();  // warm up: connections made, buffers touched
  MPI_Barrier(MPI_COMM_WORLD);
  const Cpu c0 = process_cpu();
  const double s0 = softirq_s(), t0 = now_s();
  const long long rx0 = softirq_count("NET_RX:"), tx0 = softirq_count("NET_TX:");
  for (int r = 0; r < reps; ++r) {
    RequestPtr req = comm.iallreduce_sum(grads);
    while (!req->test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // "computing"
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double wall = now_s() - t0, soft = softirq_s() - s0;
  const long long rx = softirq_count("NET_RX:") - rx0, tx = softirq_count("NET_TX:") - tx0;
  const Cpu c1 = process_cpu();
  double mine[2] = {c1.user - c0.user, c1.sys - c0.sys}, all[4] = {};
  MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  comm.set_background_progress(false);
  set_active_progress(nullptr);
  if (rank == 0) {
    const double gb = mib * reps * 1024 * 1024 / 1e9;  // gradient bytes all-reduced
    const double user = all[0] + all[2], sys = all[1] + all[3];
    std::printf("%8.0f %5d %4d-%-5d %8.3f %8.3f %8.3f %8.3f %8.3f %10.3f %10.0f %10.0f\n", mib, reps, poll_us, max_poll_us, wall, gb / wall,
                user / gb, sys / gb, soft / gb, (user + sys + soft) / gb, static_cast<double>(rx) / gb,
                static_cast<double>(tx) / gb);
  }
  MPI_Finalize();
  return 0;
}
