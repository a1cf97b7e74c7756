#include "plan/calibration.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>
#include <vector>

#include "backend/gpu_peaks.hpp"
#include "core/error.hpp"
#include "model/block_cost.hpp"
#include "model/family.hpp"

namespace relay {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Mean seconds of `run` over enough repeats to last ~0.2 s, after one warm-up.
template <class F>
double time_of(Backend& be, F run) {
  run();
  be.synchronize();
  int reps = 0;
  const double t0 = now();
  double t = t0;
  while (reps < 3 || t - t0 < 0.2) {
    run();
    be.synchronize();
    ++reps;
    t = now();
  }
  return (t - t0) / reps;
}

Tensor filled(Backend& be, Shape shape, DType dt, float v = 0.01f) {
  Tensor t(be, std::move(shape), dt);
  be.fill(t, v);
  return t;
}

std::string measured_key(const char* op, double busbw) {
  return busbw > 0 ? cat(op, "_bandwidth = ", busbw, "\n") : std::string();
}

// A link's keys: the fitted ones, or the copy bandwidth halved where nothing was measured.
std::string link_keys(const LinkFit& fit, double copy_bandwidth, double share) {
  if (!fit.ok) return cat("bandwidth = ", copy_bandwidth / 2, "\nefficiency = 1.0\nlatency = 2e-6\n\n");
  char share_text[32];
  std::snprintf(share_text, sizeof share_text, "%.3f", share);
  return cat("bandwidth = ", fit.busbw, "   # fitted bus bandwidth, bytes/s\n",
             "efficiency = 1.0              # the measured bandwidth is what a collective reaches\n",
             "latency = ", fit.latency, "   # fitted seconds per ring step\n",
             "# Each collective's own bus bandwidth over its sizes of 4 MiB and more, MPI's sums included (plan/cluster.hpp):\n",
             measured_key("all_reduce", fit.measured.all_reduce), measured_key("all_gather", fit.measured.all_gather),
             measured_key("reduce_scatter", fit.measured.reduce_scatter),
             measured_key("all_to_all", fit.measured.all_to_all),
             share >= 0 ? cat("# Compute lost per second of a collective hidden behind it (GEMMs beside 16 MiB all-reduces moved by\n",
                              "# a progress thread, against GEMMs alone, every member at once):\n",
                              "overlap_compute_share = ", share_text, "\n")
                        : std::string(),
             "\n");
}

// The comment over a measured link: how, and the table with the fit against each time.
std::string measured(const std::string& how, const std::vector<CollectiveSample>& samples, const LinkFit& fit) {
  char rms[32];
  std::snprintf(rms, sizeof rms, "%.0f%%", 100 * fit.rms_error);
  return cat("# Measured through the communicator: ", how, ". Bus bandwidth as nccl-tests reports it; `fit` is\n",
             "# the alpha-beta line of the keys below against each time (root-mean-square ", rms, "):\n",
             samples_table(samples, fit));
}

}  // namespace

std::string calibrate_this_machine(Backend& be, const ModelLayout& layout, int64_t rows, int threads,
                                   Precision precision, const LinkCalibration* links) {
  const double free_at_start = double(be.available_bytes());  // a GPU's memory before this allocates any
  const BlockSpec* block = nullptr;
  BlockCost cost;
  for (const BlockSpec& b : layout.blocks()) {
    cost = block_cost(b, {}, double(rows));
    if (cost.attention.on()) {
      block = &b;
      break;
    }
  }
  if (!block)
    throw Error(cat("--calibrate: the model has no decoder block to measure (model.type = ",
                    family_names(&ModelKeys::language_model), ")"));
  const DType dt = compute_dtype(precision);
  const int64_t C = block->in, T = block->seq_len, n = rows, B = std::max<int64_t>(1, n / T);
  const int64_t H = cost.attention.heads, hd = cost.attention.head_dim, KV = cost.attention.kv_heads;
  const int64_t F = cost.mlp_hidden;  // the MLP's width: the dense one's, or (a MoE layer) one expert's

  // GEMMs: the block's widest projections as forward, backward-input and backward-weight shapes.
  double gemm_flops = 0, gemm_s = 0;
  for (const int64_t N : {C, F}) {
    Tensor x = filled(be, {n, C}, dt), w = filled(be, {N, C}, dt), y = filled(be, {n, N}, dt);
    Tensor dw = filled(be, {N, C}, DType::f32), dx = filled(be, {n, C}, dt);
    gemm_s += time_of(be, [&] { be.matmul(x, false, w, true, y, 1.f, 0.f); });    // y = x w^T
    gemm_s += time_of(be, [&] { be.matmul(y, false, w, false, dx, 1.f, 0.f); });  // dx = dy w
    gemm_s += time_of(be, [&] { be.matmul(y, true, x, false, dw, 1.f, 1.f); });   // dw += dy^T x
    gemm_flops += 3 * 2.0 * double(n) * double(N) * double(C);
  }
  const double gemm_rate = gemm_flops / gemm_s;
  // What the efficiencies are fractions of: a GPU's data-sheet peak of the run's precision (so that MFU means what it
  // means on the presets), or on a CPU (no data sheet) the measured GEMM rate itself.
  const bool gpu = be.device() == Device::cuda;
  const double sheet = gpu ? gpu_peak_flops(be.describe(), precision) : 0;
  const double peak = sheet > 0 ? sheet : gemm_rate;

  // Attention at the block's heads, B sequences of T: causal FLOPs as the cost model counts them.
  const double attn = 0.5 * 4.0 * double(T) * double(H * hd) * double(B * T);
  Tensor lse = filled(be, {B, H, T}, DType::f32);
  double fwd_s = 0, bwd_s = 0;
  if (KV == H && cost.attention.packed_qkv) {
    Tensor qkv = filled(be, {B * T, 3 * C}, dt), out = filled(be, {B * T, C}, dt), dqkv = filled(be, {B * T, 3 * C}, dt);
    fwd_s = time_of(be, [&] { be.flash_attention_forward(qkv, B, T, H, out, lse); });
    bwd_s = time_of(be, [&] { be.flash_attention_backward(out, qkv, out, lse, B, T, H, dqkv); });
  } else {
    Tensor q = filled(be, {B * T, H * hd}, dt), k = filled(be, {B * T, KV * hd}, dt), v = filled(be, {B * T, KV * hd}, dt);
    Tensor out = filled(be, {B * T, H * hd}, dt), dq = filled(be, {B * T, H * hd}, dt);
    Tensor dk = filled(be, {B * T, KV * hd}, dt), dv = filled(be, {B * T, KV * hd}, dt);
    fwd_s = time_of(be, [&] { be.flash_attention_gqa_forward(q, k, v, B, T, H, KV, out, lse); });
    bwd_s = time_of(be, [&] { be.flash_attention_gqa_backward(out, q, k, v, out, lse, B, T, H, KV, dq, dk, dv); });
  }
  // Within the range the cluster file's reader accepts ([1e-4, 1], plan/cluster.cpp), so the file always loads.
  const double attn_fwd_eff = std::clamp(attn / fwd_s / peak, 1e-4, 1.0),
               attn_bwd_eff = std::clamp(2.5 * attn / bwd_s / peak, 1e-4, 1.0);

  // Streaming: a 64 MiB copy (read and write); the launch term: one of 200 one-element copies queued back to back.
  const int64_t big = int64_t(16) << 20;
  Tensor a = filled(be, {big}, DType::f32), b = filled(be, {big}, DType::f32);
  const double bandwidth = 2.0 * 4.0 * double(big) / time_of(be, [&] { be.copy(b, a); });
  Tensor s1 = filled(be, {1}, DType::f32), s2 = filled(be, {1}, DType::f32);
  const double launch = time_of(be, [&] {
                          for (int i = 0; i < 200; ++i) be.copy(s2, s1);
                        }) / 200;

  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  // A CPU node's devices: its cores / threads a rank; launched over several hosts, the ranks each host was given (the
  // run under the same launch groups its ranks so: one rank a host makes every dp group cross the link between them).
  const bool across_hosts = links && links->nodes >= 2;
  // NCCL's collectives move on the GPU by themselves; MPI's (every CPU run, and parallel.comm = "mpi") do not.
  const bool async = gpu && !(links && links->comm == "mpi");
  const int devices = gpu            ? std::max(1, cuda_device_count())
                      : across_hosts ? std::max(1, links->ranks_per_node)
                                     : std::max(1, cores / std::max(1, threads));
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const double memory = gpu ? free_at_start : ram / devices;
  char host[256] = "this machine";
  gethostname(host, sizeof host);
  std::time_t t = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  const std::string how = links ? cat(links->comm, ", ", links->world, " ranks on ", links->nodes, " host(s)") : "";
  std::string intra = "[intra_node]\n", inter = "[inter_node]\n";
  if (links && links->intra_fit.ok)
    intra += measured(cat(links->ranks_per_node, " ranks on one host (", how, ")"), links->intra, links->intra_fit);
  else
    intra += links ? "# Not measured: one rank a host. The copy bandwidth halved (shared memory copies twice).\n"
                   : "# Not measured (one process; run it under mpirun -np 2 or more to measure the links through the\n"
                     "# communicator): the copy bandwidth halved (shared memory copies twice).\n";
  intra += link_keys(links ? links->intra_fit : LinkFit{}, bandwidth, links ? links->intra_share : -1);
  if (links && links->inter_fit.ok)
    inter += measured(cat("one rank on each of ", links->nodes, " hosts (", how, ")"), links->inter, links->inter_fit) +
             link_keys(links->inter_fit, bandwidth, links->inter_share);
  else
    inter += "# No second host measured: as within the node.\n" +
             link_keys(links ? links->intra_fit : LinkFit{}, bandwidth, links ? links->intra_share : -1);
  const std::string device_lines =
      sheet > 0
          ? cat("# The data sheet's dense peaks (backend/gpu_peaks.hpp); gemm_efficiency is the GEMM rate measured over the\n",
                "# block's forward, backward-input and backward-weight shapes in ", precision_name(precision), " over the peak.\n",
                "peak_bf16_flops = ", gpu_peak_flops(be.describe(), Precision::bf16), "\npeak_tf32_flops = ",
                gpu_peak_flops(be.describe(), Precision::tf32), "\npeak_fp32_flops = ",
                gpu_peak_flops(be.describe(), Precision::fp32), "\n", "gemm_efficiency = ", std::min(1.0, gemm_rate / peak),
                "   # measured ", gemm_rate, " FLOP/s\n")
          : cat("# The measured GEMM rate over the block's forward, backward-input and backward-weight shapes (every "
                "precision).\n", "peak_bf16_flops = ", gemm_rate, "\npeak_tf32_flops = ", gemm_rate, "\npeak_fp32_flops = ",
                gemm_rate, "\n", "gemm_efficiency = 1.0              # the peaks above are the measured rate\n");
  return cat(
      "# This machine (", host, ") as measured by `relay plan --measure --calibrate` on ", when, ", one device = one\n",
      "# rank of ", gpu ? std::string("one GPU") : cat(threads, " thread(s)"), ", ", precision_name(precision), ", at ", n,
      " rows of ", layout.model.blocks.size(), "-block model's shapes (src/plan/calibration.hpp).\n",
      "name = \"this-machine\"\n\n[node]\ndevices = ", devices, "                    # ",
      gpu            ? std::string("visible GPUs")
      : across_hosts ? cat("ranks a host in the launch measured (", cores, " cores here)")
                     : cat(cores, " cores / ", threads, " thread(s) a rank"),
      "\n", async ? "" : "async_progress = false         # MPI moves a collective only inside an MPI call (plan/cluster.hpp)\n",
      "\n[device]\nname = \"",
      be.describe(), "\"\nbackend = \"", gpu ? "cuda" : "cpu",
      "\"                   # the overlaps the step model prices are this backend's (plan/cluster.hpp)\n", device_lines,
      "memory_bytes = ", memory, gpu ? "   # free on the GPU with the CUDA context up\n" : "   # physical memory / devices\n",
      "reserved_bytes = 0\n",
      "memory_bandwidth = ", bandwidth, "   # a 64 MiB copy, read + write\n",
      "sms = 1                            # no wave term: the GEMM rate is measured at the model's shapes\n",
      "attention_forward_efficiency = ", attn_fwd_eff, "   # flash attention forward (causal FLOPs) / the peak\n",
      "attention_backward_efficiency = ", attn_bwd_eff, "  # its backward, 2.5x the forward's FLOPs\n",
      "memory_efficiency = 1.0\n",
      "kernel_launch_s = ", launch, "     # a one-element copy, queued back to back\n\n",
      intra, inter,
      "[storage]\nwrite_bandwidth = 1e9                # assumed, not measured\n");
}

}  // namespace relay
