// A cluster description for the planner (configs/clusters/*.toml): devices per node, one device's peaks
// (FLOP/s by precision, memory, bandwidth) and achieved-efficiency defaults, and the two links a
// collective can cross (within a node, between nodes). Every key is required but a link's reduce_bandwidth and
// <collective>_bandwidth and device.peak_fp8_flops: a missing one is an Error naming the file and the key.
#pragma once
#include <string>

#include "core/precision.hpp"
#include "core/tensor.hpp"

namespace relay {

struct Link {
  double bandwidth = 0;   // bytes/s per device, each way (data sheet)
  double efficiency = 1;  // fraction of bandwidth a large NCCL collective reaches (nccl-tests busbw)
  double latency = 0;     // seconds per ring step (alpha)
  // Optional: bytes/s at which a rank sums what a reducing collective (all-reduce, reduce-scatter) receives, where
  // that is slower than the link: MPI reduces in a loop on the CPU after each copy (measured by --calibrate). 0 (the
  // presets): NCCL reduces inside its copy kernels at line rate.
  double reduce_bandwidth = 0;
  // Optional (written by --calibrate): each collective's own bus bandwidth as measured through the communicator, its
  // sums included, bytes/s (nccl-tests' busbw). MPI's algorithms differ by collective: Open MPI 4.1's non-blocking
  // reduce-scatter between two ranks reduces to one rank and scatters back, at a third of its all-reduce's busbw over
  // TCP. Where one is set, that collective is priced with it (and the latency) alone; 0: the alpha-beta form of
  // bandwidth, efficiency and reduce_bandwidth.
  struct Measured {
    double all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0;
  } measured;
  // Optional (written by --calibrate): the seconds of compute a rank loses for each second one of this link's
  // collectives runs beside it, hidden by parallel.overlap: the progress thread's tests and the transport's own CPU
  // work (TCP copies, the kernel's packet path) on cores the ranks' compute also needs. 0 (the presets): a GPU's
  // collectives run on their own engines and the host's spare cores.
  double overlap_compute_share = 0;
  double busbw() const { return bandwidth * efficiency; }
};

struct Cluster {
  std::string source, name;
  int devices_per_node = 0;
  // Optional [node] async_progress: whether a started collective moves while its rank computes without Relay's
  // progress thread (parallel.overlap = false). NCCL's kernels do (true, the default); Open MPI's TCP and shared-memory
  // transports move only inside the rank's MPI calls (--calibrate writes false for the mpi communicator), so without
  // the thread ZeRO-3's prefetched gathers and ZeRO-2/3's bucket reduce-scatters wait in full.
  bool async_progress = true;
  struct Device {
    std::string name;
    // Optional [device] backend = "cuda" (the default: the presets are GPUs) | "cpu" (`relay plan --calibrate` writes
    // the backend it measured): which of Relay's overlaps the step model prices, those the backend runs
    // (tp_overlaps, ep_overlaps: the tensor-parallel collective matmuls and asynchronous input-gradient sums and the
    // expert all-to-alls in two parts run on the CPU backend only for now).
    ::relay::Device backend = ::relay::Device::cuda;
    double peak_bf16 = 0, peak_tf32 = 0, peak_fp32 = 0;  // dense FLOP/s
    double peak_fp8 = 0;  // dense FP8 (e4m3 / e5m2) tensor-core FLOP/s; 0: the device has none (optional key)
    double memory_bytes = 0, reserved_bytes = 0;         // capacity; what the runtime takes before Relay
    double memory_bandwidth = 0;                         // bytes/s
    int sms = 0;                                         // streaming multiprocessors (GEMM wave quantisation)
    double gemm_efficiency = 1;                          // best GEMM rate / peak
    double attention_forward_efficiency = 1, attention_backward_efficiency = 1;
    double memory_efficiency = 1;                        // streaming kernels' bandwidth / data sheet
    double kernel_launch_s = 0;
    // The peak MFU is quoted against: under fp8 the bf16 one (attention, norms and the head run in bf16; the FP8
    // GEMMs' own rate is gemm_peak's).
    double peak(Precision p) const { return p == Precision::bf16 || p == Precision::fp8 ? peak_bf16 : p == Precision::tf32 ? peak_tf32 : peak_fp32; }
    double gemm_peak(Precision p) const { return p == Precision::fp8 ? peak_fp8 : peak(p); }
  } device;
  Link intra_node, inter_node;
  double storage_write_bandwidth = 0;  // bytes/s one node writes to the shared file system
};

// Reads and checks a cluster file; Error "FILE: section.key: why" on a missing or bad key.
Cluster load_cluster(const std::string& path);
Cluster parse_cluster_text(const std::string& text, const std::string& source);

}  // namespace relay
