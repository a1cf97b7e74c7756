// `relay plan --measure --calibrate OUT` under mpirun: the links of this machine (and, when the ranks span several
// hosts, between them) measured through Relay's own communicator, as nccl-tests measures NCCL: all-reduce,
// all-gather, reduce-scatter and all-to-all of 4 KiB to 16 MiB, each size timed over ~50 ms of repeats, the slowest
// rank's mean kept (the best of three trials). Each time is turned into nccl-tests' bus bandwidth (algbw x 2(n-1)/n for all-reduce, x (n-1)/n
// for the others) and fitted to the planner's alpha-beta forms (plan/collectives.hpp):
//   t = steps x alpha + bus bytes / busbw [+ reduced bytes / reduce_bw],
// steps = 2(n-1) for the ring all-reduce and n - 1 for the others; reduced bytes = (n-1)/n of the buffer for
// all-reduce and reduce-scatter, which MPI sums on the CPU after copying (on this 2-core machine at a third of the
// copy's rate), so the moves (all-gather, all-to-all) give alpha (small ones) and busbw (large ones) and the
// reductions' remainder gives reduce_bw. They become the cluster file's `latency` and `bandwidth` (efficiency 1: the
// measured figure already is what a collective reaches); each collective's own busbw over its large sizes becomes its
// `<collective>_bandwidth` (MPI runs each with its own algorithm: one line for all of them was off by -50% to +30% over
// TCP, bench/RESULTS.md); the table goes into the file as a comment.
#pragma once
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "plan/cluster.hpp"

namespace relay {

struct CollectiveSample {
  std::string op;   // "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
  int ranks = 0;    // the group's size n
  double bytes = 0;  // the whole buffer (nccl-tests' size): each rank's input for all-reduce and all-to-all, the
                     // gathered result for all-gather, the input for reduce-scatter
  double seconds = 0;
  double algbw() const { return bytes / seconds; }
  double bus_factor() const;  // busbw / algbw
  double steps() const;       // ring steps of the alpha-beta form
  double reduced_bytes() const;  // what a rank sums: (n-1)/n of the buffer for the reductions, else 0
  double busbw() const { return algbw() * bus_factor(); }
};

struct LinkFit {
  bool ok = false;
  double busbw = 0;    // bytes/s
  double latency = 0;  // seconds per step (alpha)
  double reduce_bw = 0;  // bytes/s; 0: the reductions cost no more than the moves
  // Each collective's own bus bandwidth from its samples of 4 MiB and more (after the latency), sums included: what
  // the cluster file's <collective>_bandwidth keys carry (plan/cluster.hpp); 0 where it has none.
  Link::Measured measured;
  double rms_error = 0;  // the fit's root-mean-square relative error over the samples
  double op_busbw(const CollectiveSample& s) const;  // the collective's measured busbw, or 0
  double predict(const CollectiveSample& s) const {
    const double own = op_busbw(s);
    if (own > 0) return s.steps() * latency + s.bytes * s.bus_factor() / own;
    return s.steps() * latency + s.bytes * s.bus_factor() / busbw + (reduce_bw > 0 ? s.reduced_bytes() / reduce_bw : 0);
  }
};

// Every member of `group` (2 or more ranks) calls this at once; every member gets the same samples (the slowest
// member's time of each).
std::vector<CollectiveSample> time_collectives(Communicator& group, Backend& be);

// Link::overlap_compute_share of the group's link: every member times 256^3 GEMMs alone (all members at once, as a
// run's ranks compute), then the same GEMMs while 16 MiB all-reduces, one after another for about half a second
// (`allreduce_16mib_s`: one's time alone, from time_collectives), are moved by a progress thread as parallel.overlap
// moves a step's collectives: 1 - the GEMM rate beside them / alone, the members' mean, in [0, 1]. Needs
// MPI_THREAD_MULTIPLE (-1 without it: not measured).
double overlap_compute_share(Communicator& group, Backend& be, double allreduce_16mib_s);

// The alpha-beta fit, relative-error weighted (each time by 1 / t): busbw from the moves (all-gather, all-to-all;
// every sample when there are none) of 1 MiB and more, as nccl-tests' headline figure; alpha >= 0 from the moves of
// 64 KiB and less; reduce_bw from what the reductions of 1 MiB and more take beyond a move of their bytes (none when
// nothing). ok = false when the samples give no positive bandwidth.
LinkFit fit_link(const std::vector<CollectiveSample>& samples);

// The nccl-tests-like table of the samples with the fit's relative error per row, as TOML comment lines.
std::string samples_table(const std::vector<CollectiveSample>& samples, const LinkFit& fit);

// What the links section of a calibration file says: measured links, or why they were not.
struct LinkCalibration {
  int world = 1, nodes = 1, ranks_per_node = 1;
  std::vector<CollectiveSample> intra, inter;  // within node 0 (ranks_per_node >= 2); between nodes' first ranks
  LinkFit intra_fit, inter_fit;
  double intra_share = -1, inter_share = -1;  // overlap_compute_share of each link (-1: not measured)
  std::string comm;  // the communicator's name
};

}  // namespace relay
