// relay plan --measure: blocks timed alone on this machine, and the links between launched ranks (plan/measure.hpp).
#include "plan/measure.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "comm/mpi_check.hpp"
#include "comm/mpi_communicator.hpp"
#ifdef RELAY_HAVE_CUDA
#include "comm/nccl_communicator.hpp"
#endif
#include "core/rng.hpp"
#include "model/model_spec.hpp"
#include "model/param.hpp"

namespace relay {

BlockTimes time_block(Backend& be, const BlockSpec& planned, int64_t rows) {
  BlockSpec spec = planned;
  spec.moe.ep = spec.moe.cp = spec.moe.parts = 1;  // one process: every expert here, whole sequences
  spec.sp = 1;  // and every row (the layout's sequence parallelism splits rows over tp ranks this process is not)
  ParamStore store(be, 1, 1, 0, spec.dtype);
  auto layer = make_block(spec, store);
  const bool tokens = spec.in == 0;
  const DType dt = spec.dtype;
  Tensor x = tokens ? Tensor(be, {rows}, DType::i32) : Tensor(be, {rows, spec.in}, dt);
  Tensor y(be, {rows, spec.out}, dt), dy(be, {rows, spec.out}, dt), dx(be, {rows, std::max<int64_t>(1, spec.in)}, dt);
  std::vector<float> h(static_cast<size_t>(rows * std::max(spec.in, spec.out)));
  Rng rng(7, static_cast<uint64_t>(spec.index));
  for (auto& v : h) v = float(rng.normal());
  if (tokens) {
    std::vector<int32_t> ids(static_cast<size_t>(rows), 0);
    be.upload(x, ids.data());
  } else {
    be.upload_f32(x, h.data());
  }
  be.upload_f32(dy, h.data());
  for (Param* p : store.all()) {
    p->grad = Tensor(be, p->value.shape());
    be.fill(p->grad, 0.f);
  }
  BlockSaved saved;
  layer->allocate_saved(be, rows, saved);
  auto clock = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  BlockTimes t;
  const int reps = 5;
  for (int r = -1; r < reps; ++r) {  // r = -1 warms up
    double t0 = clock();
    layer->forward(be, x, y, saved);
    be.synchronize();
    double t1 = clock();
    if (!tokens) layer->backward_input(be, x, dy, dx, saved);
    be.synchronize();
    double t2 = clock();
    layer->backward_weight(be, x, dy, saved);
    be.synchronize();
    double t3 = clock();
    if (r >= 0) {
      t.forward += (t1 - t0) / reps;
      t.backward_input += (t2 - t1) / reps;
      t.backward_weight += (t3 - t2) / reps;
    }
  }
  return t;
}

MeasuredCosts measure_costs(Backend& be, const ModelLayout& layout, int64_t rows) {
  MeasuredCosts m;
  Costs& c = m.costs;
  c.chunk_forward.assign(static_cast<size_t>(layout.num_chunks()), 0);
  c.chunk_backward_input = c.chunk_backward_weight = c.chunk_forward;
  for (const BlockSpec& b : layout.blocks()) {
    const BlockTimes t = time_block(be, b, rows);
    m.blocks.push_back(t);
    const size_t ch = static_cast<size_t>(layout.chunk_of_block(b.index));
    c.chunk_forward[ch] += t.forward;
    c.chunk_backward_input[ch] += t.backward_input;
    c.chunk_backward_weight[ch] += t.backward_weight;
  }
  return m;
}

bool LaunchedRanks::launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

LaunchedRanks::LaunchedRanks() {
  int provided = 0;
  // MULTIPLE where the library gives it: overlap_compute_share runs a progress thread as parallel.overlap does.
  MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
}

LaunchedRanks::~LaunchedRanks() { MPI_Finalize(); }

LinkCalibration LaunchedRanks::measure(const Config& cfg) {
  LinkCalibration l;
  l.world = size_;
  if (size_ < 2) return l;
  // Hosts as the process grid finds them (MPI_COMM_TYPE_SHARED); their first ranks count them.
  MPI_Comm node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int node_rank = 0, node_size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  int first = node_rank == 0;
  MPI_CHECK(MPI_Allreduce(&first, &l.nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  l.ranks_per_node = node_size;
  const Device device = resolve_device(cfg.train.device);
  auto be = make_backend(BackendOptions{device, 1, device == Device::cuda ? node_rank % cuda_device_count() : 0,
                                        Precision::fp32});
  auto communicator = [&](MPI_Comm c) -> std::unique_ptr<Communicator> {
#ifdef RELAY_HAVE_CUDA
    if (device == Device::cuda && cfg.parallel.comm != "mpi") return make_nccl_communicator(c, *be, false);
#endif
    return std::make_unique<MpiCommunicator>(c, *be);
  };
  // What hiding a collective costs the compute, where Relay's progress thread moves it (MPI; NCCL's kernels need no
  // host thread): with the largest all-reduce's time alone.
  auto share = [&](Communicator& c, const std::vector<CollectiveSample>& samples) {
    if (c.name() != "mpi") return -1.0;
    double big = 0, s = 0;
    for (const CollectiveSample& x : samples)
      if (x.op == "all_reduce" && x.bytes > big) big = x.bytes, s = x.seconds;
    return overlap_compute_share(c, *be, s * (16 << 20) / std::max(big, 1.0));
  };
  if (node_size >= 2) {  // every host at once, as a run's tp or ep groups would; rank 0 keeps its host's
    auto c = communicator(node);
    l.comm = c->name();
    l.intra = time_collectives(*c, *be);
    l.intra_fit = fit_link(l.intra);
    l.intra_share = share(*c, l.intra);
  }
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, node_rank == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
  if (leaders != MPI_COMM_NULL && l.nodes >= 2) {
    auto c = communicator(leaders);
    l.comm = c->name();
    l.inter = time_collectives(*c, *be);
    l.inter_fit = fit_link(l.inter);
    l.inter_share = share(*c, l.inter);
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
  MPI_Comm_free(&node);
  if (l.comm.empty()) l.comm = "mpi";
  return l;
}

void LaunchedRanks::release(int status) {
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD, &req));
  MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
}

int LaunchedRanks::wait_for_rank0() {
  int status = 1, done = 0;
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD, &req));
  while (!done) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

}  // namespace relay
