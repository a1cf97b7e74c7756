// Relay's MoE layer (model/moe.hpp: MoeMlp, on the CPU backend in fp32) forward and backward on weights and inputs
// from a file, for tests/torch/test_deepseek_moe_reference.py, which compares it with transformers' DeepseekV3MoE, and
// for tests/test_deepseek_moe_mpi.cpp, which compares its layouts with the serial run.
//   moe_layer <in.bin> <out.bin>                          serially
//   mpirun -np P moe_layer <in.bin> <out.bin> ep|tp|cp    over P real ranks: ep, each rank the next n / P tokens (whole
//     sequences) and E / P experts, the shared experts replicated; tp, every rank all tokens, each expert's and the
//     shared experts' SwiGLU units split (gate, up by rows, down by columns), the router whole; cp, each rank T / P
//     rows of every sequence (context parallelism's load-balanced chunks), every weight whole, a sequence's
//     load-balancing statistics summed over the ranks. Rank 0 writes the serial run's file: the ranks' parts of every
//     tensor put in place, partial sums summed.
// in.bin, little-endian: 12 int64 (n, T, C, E, k, F, n_group, topk_group, renormalize, n_shared, sigmoid, has_bias),
// 2 float64 (routed_scaling, aux_weight), then float32 arrays: x (n, C), dy (n, C), the router (E, C), the bias (E)
// when has_bias, the shared experts' gate (Fs, C), up (Fs, C), down (C, Fs) when n_shared (Fs = n_shared F), every
// expert's gate (F, C), up (F, C), down (C, F).
// out.bin: float32 y (n, C), dx (n, C), every parameter's gradient in the order above (the bias has none), then
// int32 experts (n, k), then float64 aux (the sum over sequences of each one's load-balancing aux) and the top-k
// choice's smallest margin (RouterStats::min_margin; rank 0's tokens under ep and cp).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/mpi_communicator.hpp"
#include "model/context_parallel.hpp"
#include "model/moe.hpp"

using namespace relay;

namespace {
template <typename T>
std::vector<T> take(std::FILE* f, size_t n, const char* what) {
  std::vector<T> v(n);  // (n)
  if (std::fread(v.data(), sizeof(T), n, f) != n) throw Error(cat("moe_layer: the input ends before ", what));
  return v;
}
template <typename T>
void put(std::FILE* f, const std::vector<T>& v) {
  if (std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) throw Error("moe_layer: cannot write the output");
}
}  // namespace

// One serial tensor (rows, cols) and this rank's part of it: the block of rows [r0, r0 + nr) and columns [c0, c0 + nc),
// either a disjoint piece or a partial sum of the whole (the ranks' parts are put in place and summed: both work);
// held: this rank has the parameter; none: it adds nothing (not held, or a copy that rank 0's stands for).
struct Part {
  int64_t rows, cols, r0 = 0, nr = -1, c0 = 0, nc = -1;
  bool held = true, none = false;
  int64_t here_rows() const { return nr < 0 ? rows : nr; }
  int64_t here_cols() const { return nc < 0 ? cols : nc; }
};

// A rank's part -> the serial tensor on rank 0 (zeros where it holds nothing, then one sum over the ranks).
template <typename T>
std::vector<T> assemble(const std::vector<T>& here, const Part& p, MPI_Datatype type) {
  std::vector<T> full(size_t(p.rows * p.cols), T(0)), out(full.size());  // (rows, cols)
  if (!p.none)
    for (int64_t r = 0; r < p.here_rows(); ++r)
      for (int64_t c = 0; c < p.here_cols(); ++c)
        full[size_t((p.r0 + r) * p.cols + p.c0 + c)] = here[size_t(r * p.here_cols() + c)];
  MPI_Reduce(full.data(), out.data(), int(full.size()), type, MPI_SUM, 0, MPI_COMM_WORLD);
  return out;
}

// A rank's rows (here (rows.size(), w), row i the serial row rows[i]) -> the serial (n, w) on rank 0, summed over
// the ranks (none: this rank adds nothing).
template <typename T>
std::vector<T> assemble_rows(const std::vector<T>& here, const std::vector<int64_t>& rows, int64_t n, int64_t w,
                             bool none, MPI_Datatype type) {
  std::vector<T> full(size_t(n * w), T(0)), out(full.size());  // (n, w)
  if (!none)
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(here.begin() + int64_t(i) * w, here.begin() + int64_t(i + 1) * w, full.begin() + rows[i] * w);
  MPI_Reduce(full.data(), out.data(), int(full.size()), type, MPI_SUM, 0, MPI_COMM_WORLD);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: moe_layer <in.bin> <out.bin> [ep|tp]\n");
    return 2;
  }
  const std::string layout = argc == 4 ? argv[3] : "";
  int P = 1, rank = 0;
  if (!layout.empty()) {
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  const bool ep_on = layout == "ep", tp_on = layout == "tp", cp_on = layout == "cp";
  int rc = 0;
  try {
    if (!layout.empty() && !ep_on && !tp_on && !cp_on)
      throw Error(cat("moe_layer: layout ", layout, ", expected ep, tp or cp"));
    std::FILE* in = std::fopen(argv[1], "rb");
    if (!in) throw Error(cat("moe_layer: cannot open ", argv[1]));
    const auto h = take<int64_t>(in, 12, "the header");
    const int64_t n = h[0], T = h[1], C = h[2], E = h[3], k = h[4], F = h[5];
    const auto reals = take<double>(in, 2, "the header's reals");
    BlockSpec spec;
    spec.kind = BlockKind::llama_layer;
    spec.in = spec.out = C;
    spec.seq_len = T;
    spec.moe.n_experts = E;
    spec.moe.k = k;
    spec.moe.ffn_hidden = F;
    spec.moe.n_group = h[6];
    spec.moe.topk_group = h[7];
    spec.moe.renormalize = h[8] != 0;
    spec.moe.n_shared = h[9];
    spec.moe.score = h[10] ? MoeSpec::Score::sigmoid : MoeSpec::Score::softmax;
    spec.moe.routed_scaling = reals[0];
    spec.moe.aux_weight = reals[1];
    spec.moe.layer = 0;
    spec.moe.expert_bias = h[11] != 0;
    if (ep_on) spec.moe.ep = P;
    if (cp_on) spec.moe.cp = P;
    const int64_t nl = ep_on || cp_on ? n / P : n;  // this rank's tokens
    if (ep_on && (n % P || nl % T || E % P)) throw Error("moe_layer: ep must divide the sequences and the experts");
    if (tp_on && (F % P || (spec.moe.n_shared * F) % P)) throw Error("moe_layer: tp must divide the SwiGLU units");
    if (cp_on && T % (2 * P)) throw Error("moe_layer: 2 cp must divide the sequence length");
    std::vector<int64_t> mine(static_cast<size_t>(nl));  // (nl) the serial row of each of this rank's rows
    for (int64_t i = 0; i < nl; ++i)
      mine[size_t(i)] = ep_on ? rank * nl + i : cp_on ? i / (T / P) * T + cp_position(T, P, rank, i % (T / P)) : i;

    auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
    auto upload = [&](Shape s, const std::vector<float>& v) {
      Tensor t(*be, std::move(s));
      be->upload_f32(t, v.data());
      return t;
    };
    const auto x = take<float>(in, size_t(n * C), "x"), dy = take<float>(in, size_t(n * C), "dy");
    std::deque<Param> params;  // stable addresses: this rank's
    std::vector<Part> parts;   // every serial parameter's, in the file's order
    // tp: gate and up split by rows, down by columns (split = 0, 1; -1 whole); expert e: held by its ep rank only.
    auto param = [&](Shape s, const char* what, int split = -1, int64_t expert = -1) {
      const auto whole = take<float>(in, size_t(shape_numel(s)), what);
      Part part{s[0], s[1]};
      if (tp_on && split < 0 && rank != 0) part.none = true;  // tp: the router's gradient is the same on every rank
      if (ep_on && expert >= 0 && expert_owner(expert, E, P) != rank) {
        part.held = false;
        part.none = true;
        parts.push_back(part);
        return;
      }
      std::vector<float> mine = whole;  // (rows, cols) this rank's block
      if (tp_on && split == 0) {
        part.nr = s[0] / P, part.r0 = rank * part.nr;
        mine.assign(whole.begin() + part.r0 * s[1], whole.begin() + (part.r0 + part.nr) * s[1]);
      } else if (tp_on && split == 1) {
        part.nc = s[1] / P, part.c0 = rank * part.nc;
        mine.clear();
        for (int64_t r = 0; r < s[0]; ++r)
          mine.insert(mine.end(), whole.begin() + r * s[1] + part.c0, whole.begin() + r * s[1] + part.c0 + part.nc);
      }
      parts.push_back(part);
      const Shape here{part.here_rows(), part.here_cols()};
      Param& p = params.emplace_back();
      p.value = upload(here, mine);
      p.grad = Tensor(*be, here);
      be->fill(p.grad, 0.f);
      p.shape = here;
      p.full_shape = s;
    };
    param({E, C}, "the router");
    std::vector<float> bias;
    if (spec.moe.expert_bias) bias = take<float>(in, size_t(E), "the bias");
    const int64_t Fs = spec.moe.shared_hidden();
    if (Fs > 0) {
      param({Fs, C}, "the shared gate", 0);
      param({Fs, C}, "the shared up", 0);
      param({C, Fs}, "the shared down", 1);
    }
    for (int64_t e = 0; e < E; ++e) {
      param({F, C}, "an expert's gate", 0, e);
      param({F, C}, "an expert's up", 0, e);
      param({C, F}, "an expert's down", 1, e);
    }
    std::fclose(in);

    std::vector<Param*> ptrs;
    for (Param& p : params) ptrs.push_back(&p);
    std::unique_ptr<MpiCommunicator> comm;
    ExpertParallel ep;
    TensorParallel tp;
    if (!layout.empty()) comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, *be);
    if (ep_on) ep = ExpertParallel{comm.get(), P, rank, std::make_shared<ExpertExchangeStats>()};
    if (tp_on) tp = TensorParallel{comm.get(), P, rank};
    ContextParallel cp;
    if (cp_on) cp = ContextParallel{comm.get(), P, rank, nullptr};
    MoeMlp moe(spec, ptrs, ep, tp, cp);
    if (!bias.empty()) moe.set_bias(*be, bias.data());
    std::vector<Tensor> saved;
    allocate_buffers(*be, MoeMlp::saved_shapes(spec, nl, tp.size), saved);
    std::vector<float> xl, dyl;  // (nl, C) this rank's rows
    for (int64_t r : mine) {
      xl.insert(xl.end(), x.begin() + r * C, x.begin() + (r + 1) * C);
      dyl.insert(dyl.end(), dy.begin() + r * C, dy.begin() + (r + 1) * C);
    }
    Tensor tx = upload({nl, C}, xl), tdy = upload({nl, C}, dyl), y(*be, {nl, C}), dx(*be, {nl, C});
    moe.forward(*be, tx, y, saved.data());
    moe.backward_input(*be, tdy, dx, saved.data());
    moe.backward_weight(*be, tx, saved.data());
    std::vector<RouterStats> stats;
    moe.take_stats(stats);

    auto get = [&](const Tensor& t) {
      std::vector<float> v(size_t(t.numel()));  // (numel)
      be->download(v.data(), t);
      return v;
    };
    std::vector<int32_t> experts(size_t(nl * k));  // (nl, k) the saved routing: the layer's first buffers
    be->download(experts.data(), saved[3]);
    std::vector<std::vector<float>> outs{get(y), get(dx)};
    for (Param& p : params) outs.push_back(get(p.grad));
    double aux = stats.at(0).aux_sum;
    if (!layout.empty()) {  // the serial tensors on rank 0
      // y and dx: ep and cp, this rank's rows; tp, partial sums (MoeMlp leaves their all-reduce to the caller).
      std::vector<std::vector<float>> whole{assemble_rows(outs[0], mine, n, C, false, MPI_FLOAT),
                                            assemble_rows(outs[1], mine, n, C, false, MPI_FLOAT)};
      size_t at = 2;
      for (const Part& part : parts)
        whole.push_back(assemble(part.held ? outs[at++] : std::vector<float>(), part, MPI_FLOAT));
      outs = std::move(whole);
      experts = assemble_rows(experts, mine, n, k, tp_on && rank != 0, MPI_INT);
      double sum = 0;
      if (tp_on && rank != 0) aux = 0;  // every tp rank counts the same sequences
      MPI_Reduce(&aux, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
      aux = sum;
    }
    if (rank == 0) {
      std::FILE* out = std::fopen(argv[2], "wb");
      if (!out) throw Error(cat("moe_layer: cannot write ", argv[2]));
      for (const auto& v : outs) put(out, v);
      put(out, experts);
      put(out, std::vector<double>{aux, stats.at(0).min_margin});
      std::fclose(out);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    if (!layout.empty()) MPI_Abort(MPI_COMM_WORLD, 1);
    rc = 1;
  }
  if (!layout.empty()) MPI_Finalize();
  return rc;
}
