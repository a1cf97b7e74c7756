// Building a rank's run: the process grid and backend, the communicators, the data, the model's
// chunks with their parameter store, the gradient buckets, the optimizer and the executor.
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "backend/cpu_backend.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "parallel/sharding.hpp"
#include "parallel/simulator.hpp"
#include "train/memory_plan.hpp"
#include "train/run_state.hpp"
#ifdef RELAY_HAVE_CUDA
#include "comm/nccl_communicator.hpp"
#endif

namespace relay {

namespace {

// CPU threads for this rank: train.threads, else OMP_NUM_THREADS, else the cores this process may
// use (its affinity mask) shared among the ranks of this node when they were not bound.
int threads_for_rank(const Config& cfg, int local_size) {
  if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
  if (const char* e = std::getenv("OMP_NUM_THREADS"))
    if (std::atoi(e) > 0) return std::atoi(e);
  cpu_set_t set;
  int affinity = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (affinity < hw) return std::max(1, affinity);  // bound by the launcher: use what we were given
  return std::max(1, affinity / std::max(1, local_size));
}

std::unique_ptr<Communicator> make_group_comm(Run& r, MPI_Comm c, bool point_to_point) {
#ifdef RELAY_HAVE_CUDA
  if (r.be->device() == Device::cuda && r.cfg.parallel.comm != "mpi") return make_nccl_communicator(c, *r.be, point_to_point);
#endif
  (void)point_to_point;
  return std::make_unique<MpiCommunicator>(c, *r.be);
}

void open_data(Run& r) {
  const Config& cfg = r.cfg;
  const ModelSpec model = make_model_spec(cfg, 1);  // widths after the input do not depend on it
  if (model.language_model) {
    r.train_data.tokens.emplace(cfg.data.train, cfg.model.block_size, cfg.model.vocab_size, "data.train");
    if (!cfg.data.eval.empty()) {
      r.eval_data.tokens.emplace(cfg.data.eval, cfg.model.block_size, cfg.model.vocab_size, "data.eval");
      if (r.eval_data.tokens->tokenizer() != r.train_data.tokens->tokenizer())
        throw Error(cat("data.eval: ", cfg.data.eval, " was tokenized with \"", r.eval_data.tokens->tokenizer(),
                        "\" but data.train (", cfg.data.train, ") with \"", r.train_data.tokens->tokenizer(), "\""));
    }
    if (cfg.data.document_mask) {
      // Documents end at the token file's end-of-text token, which relay data tokenize records as eot_id.
      const int64_t eot = r.train_data.tokens->eot_id();
      if (eot < 0)
        throw Error(cat("data.document_mask: data.train (", cfg.data.train, ") has no eot_id attribute, so its "
                        "documents cannot be told apart (make it with relay data tokenize, which records it)"));
      if (r.eval_data.tokens && r.eval_data.tokens->eot_id() != eot)
        throw Error(cat("data.document_mask: data.eval (", cfg.data.eval, ") has eot_id ", r.eval_data.tokens->eot_id(),
                        " but data.train has ", eot));
      r.documents = DocumentLayout{int32_t(eot), cfg.data.reset_positions};
    }
    return;
  }
  // Every rank reads the file's shapes; only the last stage, which reads targets, checks class ranges.
  LossKind lk = parse_loss(cfg.model.loss);
  DatasetSpec spec;
  spec.targets = lk == LossKind::cross_entropy ? TargetKind::class_index : TargetKind::dense;
  const int64_t out_dim = model.output_dim;
  if (r.grid.is_last_stage()) {
    if (lk == LossKind::cross_entropy) spec.num_classes = out_dim;
    else spec.target_dim = out_dim;
  }
  r.train_data.features.emplace(cfg.data.train, spec, "data.train");
  if (!cfg.data.eval.empty()) {
    DatasetSpec es = spec;
    es.features = r.train_data.features->features();
    r.eval_data.features.emplace(cfg.data.eval, es, "data.eval");
  }
}

// data.preload: this rank's first-stage training inputs, all of them, in the compute dtype on the device (read in
// pieces of at most 64 MiB of float32). "auto" preloads on a GPU when they take at most a quarter of its free memory.
// (Feature files are an MLP's: no documents or cp, so only the first stage reads inputs.)
void preload_inputs(Run& r) {
  const Config& cfg = r.cfg;
  if (!r.train_data.features || !r.grid.is_first_stage() || cfg.data.preload == "off") return;
  const Hdf5Dataset& data = *r.train_data.features;
  const int64_t N = data.samples(), D = data.features();
  const DType dt = compute_dtype(cfg.train.precision);
  const int64_t bytes = N * D * int64_t(dtype_size(dt));
  if (cfg.data.preload == "auto" && (r.be->device() != Device::cuda || bytes > r.be->available_bytes() / 4)) return;
  if (N > INT32_MAX)
    throw Error(cat("data.preload: data.train (", cfg.data.train, ") has ", N, " samples; preloaded rows are indexed "
                    "by int32 (at most ", INT32_MAX, "): set data.preload = \"off\""));
  MemoryScope scope(MemKind::other);  // data, not one of the plan's kinds
  Tensor all(*r.be, {N, D}, dt);      // (N, D)
  const int64_t piece = std::max<int64_t>(1, (int64_t(64) << 20) / (D * 4));
  std::vector<int64_t> rows;
  std::vector<float> host;
  for (int64_t at = 0; at < N; at += piece) {
    const int64_t len = std::min(piece, N - at);
    rows.resize(size_t(len));
    std::iota(rows.begin(), rows.end(), at);
    host.resize(size_t(len * D));
    data.read_inputs(rows, host.data());
    Tensor part = all.rows(at, len);
    r.be->upload_f32(part, host.data());  // host is read before it returns (staged), so the next piece may reuse it
  }
  r.executor->preload_inputs(all);
  r.preload_note = cat("data.preload: the ", N, " x ", D, " training inputs (", dt == DType::bf16 ? "bf16" : "float32",
                       ", ", mib(bytes), " MiB) are held on ", r.be->describe(), "; each micro-batch gathers its rows there");
}

}  // namespace

void setup_grid_and_backend(Run& r) {
  const Config& cfg = r.cfg;
  r.grid = make_process_grid(static_cast<int>(cfg.parallel.dp), static_cast<int>(cfg.parallel.pp),
                             static_cast<int>(cfg.parallel.tp), static_cast<int>(cfg.parallel.cp),
                             static_cast<int>(cfg.parallel.ep));
  set_process_identity(r.grid.world_rank, r.grid.host);
  BackendOptions bo;
  bo.device = resolve_device(cfg.train.device);
  bo.threads = threads_for_rank(cfg, r.grid.local_size);
  bo.precision = cfg.train.precision;
  bo.cpu_bf16_gemm = cfg.train.cpu_bf16_gemm;
  bo.time_bf16_gemm = r.grid.world_rank == 0;  // the others wait for its choice (below)
  if (bo.device == Device::cuda) {
    int n = cuda_device_count();
    if (n == 0) throw Error("train.device = \"cuda\" but no CUDA device is visible (hint: check CUDA_VISIBLE_DEVICES, or use train.device = \"cpu\")");
    bo.gpu = r.grid.local_rank % n;
  }
  r.be = make_backend(bo);
  // train.cpu_bf16_gemm = "auto": one choice for the job, world rank 0's, the only rank that timed the test GEMM (a
  // rank that chose otherwise would round its GEMMs differently from the others and from the serial run).
  if (auto* cpu = dynamic_cast<CpuBackend*>(r.be.get())) {
    int widen = cpu->bf16_auto_choice();
    MPI_Bcast(&widen, 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::string note = cpu->bf16_note();
    int len = int(note.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    note.resize(size_t(len));
    MPI_Bcast(note.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (widen >= 0) cpu->adopt_bf16_gemm(widen, note);
  }
  const char* verify = std::getenv("RELAY_VERIFY_TIED");
  r.verify_tied = verify && std::string(verify) == "1";
}

void setup_communicators(Run& r) {
  r.world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, *r.be);
  if (r.cfg.parallel.comm == "nccl" && r.be->device() != Device::cuda)
    throw Error("parallel.comm = \"nccl\" needs train.device = \"cuda\"");
  r.dp_comm = make_group_comm(r, r.grid.dp_comm, /*point_to_point=*/false);
  r.pp_comm = make_group_comm(r, r.grid.pp_comm, /*point_to_point=*/true);
  if (r.grid.tp > 1) {
    r.tp_comm = make_group_comm(r, r.grid.tp_comm, /*point_to_point=*/false);
    r.tp.comm = r.tp_comm.get();
    r.tp.size = r.grid.tp;
    r.tp.rank = r.grid.tp_rank;
    if (r.cfg.parallel.sequence_parallel) r.tp.sp_rows = std::make_shared<Tensor>();  // one buffer for the rank
    r.tp.waited_s = std::make_shared<double>(0.0);  // exposed communication: the step loop takes it
    // parallel.overlap: a column-parallel layer's input-gradient all-reduce progresses on the progress thread while
    // its weight gradients are computed, and so do the collective matmul's ring messages (tp_overlaps: CPU only for
    // now; on CUDA today's order, said once).
    r.tp.overlap = tp_overlaps(r.cfg.parallel.overlap, r.be->device());
    if (r.cfg.parallel.overlap && !r.tp.overlap && r.grid.world_rank == 0)
      std::printf("relay: tensor parallelism on CUDA: its collectives are not overlapped yet (input-gradient "
                  "all-reduces, sequence-parallel collective matmuls); parallel.overlap applies to the data-parallel "
                  "moves only\n");
    if (r.tp.overlap) {
      MPI_CHECK(MPI_Comm_dup(r.grid.tp_comm, &r.tp_async_mpi));
      r.tp_async_comm = make_group_comm(r, r.tp_async_mpi, /*point_to_point=*/false);
      r.tp_async_comm->set_background_progress(true);
      r.tp.async_comm = r.tp_async_comm.get();
      // sequence parallelism: a weight gradient's operand is gathered into a second buffer while the input gradient's
      // partial sums in the first are reduce-scattered
      if (r.cfg.parallel.sequence_parallel) r.tp.sp_async_rows = std::make_shared<Tensor>();
    }
  }
  if (r.grid.cp > 1) {
    r.cp_comm = make_group_comm(r, r.grid.cp_comm, /*point_to_point=*/false);
    // parallel.overlap: the key/value all-gathers progress on the progress thread while the own rows' attention runs.
    const bool cp_overlap = cp_overlaps(r.cfg.parallel.overlap);
    if (cp_overlap) r.cp_comm->set_background_progress(true);
    r.cp = ContextParallel{r.cp_comm.get(), r.grid.cp, r.grid.cp_rank,
                           std::make_shared<CpAttention>(r.cp_comm.get(), r.grid.cp, r.grid.cp_rank, cp_overlap)};
  }
  if (r.grid.ep > 1) {
    r.ep_comm = make_group_comm(r, r.grid.ep_comm, /*point_to_point=*/false);
    r.ep = ExpertParallel{r.ep_comm.get(), r.grid.ep, r.grid.ep_rank, std::make_shared<ExpertExchangeStats>()};
    // parallel.overlap: each MoE layer's two parts' all-to-alls progress on the progress thread while the other
    // part's experts run (ep_overlaps: CPU only; NCCL's in today's blocking order, said once).
    const bool ep_overlap = ep_overlaps(r.cfg.parallel.overlap, r.grid.ep, r.be->device());
    if (r.cfg.parallel.overlap && !ep_overlap && r.grid.world_rank == 0)
      std::printf("relay: expert parallelism on CUDA: the all-to-alls are not overlapped yet (NCCL's run in "
                  "today's order); parallel.overlap applies to the data-parallel moves only\n");
    if (ep_overlap) r.ep_comm->set_background_progress(true);
    if (r.grid.expert_replicas() > 1) r.expert_dp_comm = make_group_comm(r, r.grid.expert_dp_comm, /*point_to_point=*/false);
  }
  // The embedding group (Megatron-LM): the first and last pipeline rank of each (replica, tp rank),
  // which hold the same shard of the tied weight. Split on every rank (a collective); only used when
  // the model ties a weight across them.
  const ProcessGrid& g = r.grid;
  const bool member = g.pp > 1 && !make_model_spec(r.cfg, 1).tied().empty() &&
                      (g.is_first_stage() || g.is_last_stage());
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, member ? g.replica_rank() * g.tp + g.tp_rank : MPI_UNDEFINED, g.pp_rank,
                           &r.tied_mpi));
  if (member) r.tied_comm = make_group_comm(r, r.tied_mpi, /*point_to_point=*/false);
}

// ZeRO-3 gathers a block's parameters whole (its tp shard) before the block runs: a block larger than this rank can
// allocate can never run. Named before anything is allocated (the device's free bytes over the ranks sharing it).
void check_zero3_gather(Run& r) {
  const Config& cfg = r.cfg;
  const ProcessGrid& g = r.grid;
  const int64_t width = int64_t(dtype_size(compute_dtype(cfg.train.precision)));
  const int sharing = r.be->device() == Device::cpu ? g.local_size : std::max(1, g.local_size / cuda_device_count());
  const int64_t available = r.be->available_bytes() / sharing;
  for (int c = g.pp_rank; c < r.layout.num_chunks(); c += g.pp)
    for (int i = r.layout.chunks[size_t(c)].begin; i < r.layout.chunks[size_t(c)].end; ++i) {
      const BlockSpec& b = r.layout.blocks()[size_t(i)];
      int64_t bytes = 0;
      for (const ParamSpec& p : b.params) bytes += width * shape_numel(shard_shape(p.shape, p.split, g.tp, g.tp_rank));
      if (bytes > available)
        throw Error(cat("optimizer.zero = 3: block ", i, " (", block_kind_name(b.kind), ") gathers ", mib(bytes),
                        " MiB of parameters at once, but this rank can allocate ", mib(available), " MiB (",
                        r.be->device() == Device::cpu ? "the host's available memory" : "the GPU's free memory",
                        " over the ", sharing, " rank", sharing > 1 ? "s" : "", " sharing it); ",
                        r.layout.model.language_model ? "split its weights with parallel.tp" : "shrink the layer",
                        " or give each rank more memory"));
    }
}

void setup_data_and_model(Run& r) {
  const Config& cfg = r.cfg;
  const ProcessGrid& g = r.grid;
  open_data(r);
  const int64_t B = cfg.train.batch_size;
  r.mb_rows = micro_batch_rows(cfg);
  r.replica_rows = r.mb_rows * cfg.train.micro_batches;

  r.layout = make_layout(cfg, r.train_data.features ? r.train_data.features->features() : 0);
  const auto shared = r.layout.shared_params();
  r.shape = schedule_shape(cfg);
  r.shape.tied = !shared.empty();
  auto lists = generate_all(r.shape);
  SimResult sim = simulate(r.shape, lists, Costs{});  // rejects deadlocks before anything runs
  r.predicted_bubble = sim.bubble_fraction;

  r.zero3 = describe_sharding(sharding_input(cfg)).group(GradGroup::dense).parameters;
  if (r.zero3) check_zero3_gather(r);
  // This rank's chunks: c = pp_rank, pp_rank + pp, ...
  r.store = std::make_unique<ParamStore>(*r.be, cfg.model.seed, g.tp, g.tp_rank, compute_dtype(cfg.train.precision),
                                         /*defer=*/r.zero3);
  const int last = r.layout.num_chunks() - 1;
  const bool lm = r.layout.model.language_model;
  for (int c = g.pp_rank; c <= last; c += g.pp) {
    const ChunkRange& cr = r.layout.chunks[static_cast<size_t>(c)];
    std::vector<std::unique_ptr<Block>> blocks;
    for (int i = cr.begin; i < cr.end; ++i)
      blocks.push_back(make_block(r.layout.blocks()[static_cast<size_t>(i)], *r.store, r.tp, r.cp, r.ep));
    auto ch = std::make_unique<ModelChunk>(*r.be, c, std::move(blocks), c == 0, c == last, lm && c == last,
                                           cfg.train.recompute == "blocks", r.shape.kind == ScheduleKind::zb_h1);
    r.chunk_map[c] = ch.get();
    r.chunks.push_back(std::move(ch));
  }
  // Buckets: each parameter with the lowest of its chunks here (whose all-reduce comes last), placed
  // by the layout (ModelLayout::placement: tied copies, tp-replicated copies, counted once in the norm).
  std::vector<BucketParam> bucket_params;
  std::vector<Param*> tied;
  const auto placement = r.layout.placements(g.pp_rank, g.tp, g.tp_rank);
  for (auto& ch : r.chunks)
    for (auto& b : ch->blocks())
      for (Param* p : b->params()) {
        if (r.params.count(p->name)) continue;
        r.params[p->name] = p;
        const ParamPlacement& pl = placement.at(p->name);
        if (pl.tied) tied.push_back(p);
        bucket_params.push_back({p, ch->id(), b->spec().index, pl.counts_in_norm, pl.tied, pl.tp_replicated, pl.expert});
      }
  if (r.chunk_map.count(last)) {
    const int64_t V = r.layout.model.output_dim;
    r.loss = std::make_unique<Loss>(*r.be, lm ? LossKind::cross_entropy : parse_loss(cfg.model.loss),
                                    r.chunk_map[last]->out_width(), r.tp, tp_begin(V, g.tp, g.tp_rank),
                                    compute_dtype(cfg.train.precision));
  }
  r.buckets = std::make_unique<GradBuckets>(*r.be, g.replicas() > 1 ? r.dp_comm.get() : nullptr, bucket_params,
                                            zero_bucket_caps(cfg), cfg.optimizer.zero, cfg.parallel.grad_reduce,
                                            cfg.parallel.reshard_after_forward, g.pp,
                                            r.expert_dp_comm.get(), cfg.parallel.fp8_param_gather, r.tp.comm);
  if (cfg.parallel.overlap) {
    r.buckets->launch_when_filled(static_cast<int>(r.shape.m));
    for (Communicator* c : {r.dp_comm.get(), r.expert_dp_comm.get()})  // the gradient and ZeRO collectives
      if (c) c->set_background_progress(true);
  }
  for (auto& ch : r.chunks) r.buckets->watch(*ch);  // ZeRO-2: reduce-scatter each bucket as its blocks finish
  r.optimizer = make_optimizer(cfg.optimizer, *r.be, r.buckets->optimizer_slices());
  r.executor = std::make_unique<Executor>(*r.be, g, *r.pp_comm, r.chunk_map, r.loss.get(), *r.buckets, r.shape,
                                          lists[static_cast<size_t>(g.pp_rank)], r.mb_rows, r.layout.model.seq_len, B,
                                          r.tied_comm.get(), tied, r.documents, r.cp);
  preload_inputs(r);
}

void teardown(Run& r) {
  r.prefetcher.reset();
  r.tied_comm.reset();
  if (r.tied_mpi != MPI_COMM_NULL) MPI_Comm_free(&r.tied_mpi);
  r.tp_async_comm.reset();
  if (r.tp_async_mpi != MPI_COMM_NULL) MPI_Comm_free(&r.tp_async_mpi);
  free_process_grid(r.grid);
}

}  // namespace relay
