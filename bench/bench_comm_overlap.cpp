// Does a non-blocking collective move while the rank computes? (parallel.overlap, comm/progress.hpp; issue 40.)
// On 2 ranks: an all-reduce of N MiB alone (comm), oneDNN GEMMs of about the same time alone (compute), then the
// all-reduce started, the GEMMs run, the all-reduce waited for, three ways: the request left alone until the wait
// (Relay before the progress thread: Open MPI moves it only inside MPI calls), the progress thread testing it
// (MPI_Testsome at fixed poll intervals, then Relay's default back-off from 50 us to 1 ms; Relay's choice), and a
// thread that owns a blocking MPI_Allreduce (the other design). Overlap is ideal when overlapped = max(comm, compute); ratio = overlapped / (comm + compute), 0.5 at best.
// Measures; never fails. Usage: mpirun -np 2 bench_comm_overlap [MiB [poll_us ...]]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "backend/cpu_backend.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/progress.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

using namespace relay;

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// GEMMs (256 x 1024) x (1024 x 1024), one thread: the rank's compute.
struct Compute {
  std::vector<float> a = std::vector<float>(256 * 1024, 0.5f), b = std::vector<float>(1024 * 1024, 0.25f),
                     c = std::vector<float>(256 * 1024);
  void run(int gemms) {
    for (int i = 0; i < gemms; ++i) cpu::gemm(false, false, 256, 1024, 1024, 1.f, a.data(), 1024, b.data(), 1024, 0.f, c.data(), 1024);
  }
};

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    f();
    double t = now_s() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slower rank's time
    best = std::min(best, t);
  }
  return best;
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const double mib = argc > 1 ? std::atof(argv[1]) : 64;
  std::vector<int> polls;
  for (int i = 2; i < argc; ++i) polls.push_back(std::atoi(argv[i]));
  if (polls.empty()) polls = {20, 50, 200};
  CpuBackend be(1);
  cpu::set_threads(1);
  MpiCommunicator comm(MPI_COMM_WORLD, be);
  Tensor grads(be, {static_cast<int64_t>(mib * 1024 * 1024 / 4)});  // (N) f32 the "gradients"
  be.fill(grads, 1.f);
  Compute work;
  const int reps = 3;
  const double comm_s = best_of(reps, [&] { comm.iallreduce_sum(grads)->wait(); });
  // The blocking call alone: Open MPI's tuned all-reduce, not libnbc's schedule behind MPI_Iallreduce.
  const double blocking_comm_s = best_of(reps, [&] {
    MPI_Allreduce(MPI_IN_PLACE, grads.raw(), static_cast<int>(grads.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  // As many GEMMs as take about the all-reduce's time.
  const double one = best_of(reps, [&] { work.run(1); });
  const int gemms = std::max(1, static_cast<int>(comm_s / one + 0.5));
  const double compute_s = best_of(reps, [&] { work.run(gemms); });
  auto overlapped = [&] {
    return best_of(reps, [&] {
      RequestPtr r = comm.iallreduce_sum(grads);
      work.run(gemms);
      r->wait();
    });
  };
  const double alone = overlapped();
  std::vector<double> threaded;
  for (int poll : polls) {
    ProgressThread progress(poll, poll);  // a fixed interval: no back-off
    set_active_progress(&progress);
    comm.set_background_progress(true);
    threaded.push_back(overlapped());
    comm.set_background_progress(false);
    set_active_progress(nullptr);
  }
  double backoff = 0;  // Relay's default: 50 us, doubling up to 1 ms while nothing completes
  {
    ProgressThread progress;
    set_active_progress(&progress);
    comm.set_background_progress(true);
    backoff = overlapped();
    comm.set_background_progress(false);
    set_active_progress(nullptr);
  }
  const double blocking = best_of(reps, [&] {
    std::thread owner([&] { MPI_Allreduce(MPI_IN_PLACE, grads.raw(), static_cast<int>(grads.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    work.run(gemms);
    owner.join();
  });
  if (rank == 0) {
    std::printf("all-reduce of %.0f MiB on 2 ranks (1 compute thread each, %u hardware threads); best of %d\n", mib,
                std::thread::hardware_concurrency(), reps);
    std::printf("comm alone %.3f s (a blocking MPI_Allreduce alone: %.3f s), compute alone (%d GEMMs 256x1024x1024) "
                "%.3f s, sum %.3f s, max %.3f s\n", comm_s, blocking_comm_s, gemms, compute_s, comm_s + compute_s,
                std::max(comm_s, compute_s));
    std::printf("%-38s %12s %8s\n", "design", "overlapped s", "ratio");
    auto row = [&](const std::string& what, double t) {
      std::printf("%-38s %12.3f %8.2f\n", what.c_str(), t, t / (comm_s + compute_s));
    };
    row("request left until the wait", alone);
    for (size_t i = 0; i < polls.size(); ++i) row("progress thread, poll " + std::to_string(polls[i]) + " us", threaded[i]);
    row("progress thread, back-off 50-1000 us", backoff);
    row("thread owning a blocking all-reduce", blocking);
    std::printf("ratio = overlapped / (comm + compute): 1 = no overlap, 0.5 = perfect with comm = compute\n");
  }
  MPI_Finalize();
  return 0;
}
