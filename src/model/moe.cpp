// The sparse MLP of Mixtral's, Qwen3-MoE's and DeepSeek-V3's decoder layers (model/moe.hpp).
#include "model/moe.hpp"

#include <algorithm>
#include <chrono>
#include <functional>

#include "comm/trace.hpp"
#include "core/test_faults.hpp"

namespace relay {

namespace {
// Saved buffers of one micro-batch of n tokens, R = n k routed rows (MoeMlp::saved_shapes), Rl the rows this rank's
// experts may receive (R without expert parallelism).
enum : size_t { kLogits, kProbs, kLse, kExperts, kWeights, kPos, kSrc, kOffsets, kXs, kGate, kUp, kH, kYs,
                kGYs, kGGate, kGUp, kGXs, kGWeights, kGLogits, kSeqGrad, kRecvCounts, kToLocal, kToRanks, kXl, kYl,
                kGYl, kGXl, kStage, kSGate, kSUp, kSH, kSGY, kSGGate, kSGUp, kCount };

// The local experts' weight gradients (the GEMMs take their Params: Fp8Linear::grouped_matmul).
std::vector<Tensor> grads_of(const std::vector<Param*>& ps) {
  std::vector<Tensor> g;
  for (const Param* p : ps) g.push_back(p->grad);
  return g;
}

// A micro-batch's routing statistics (backward_input) run their tokens on the host's OpenMP threads from this many.
constexpr int64_t kHostParallelTokens = 256;

// Host seconds since `t0` (the all-to-all statistics).
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

MoeMlp::MoeMlp(const BlockSpec& spec, std::span<Param* const> params, const ExpertParallel& ep,
               const TensorParallel& tp, const ContextParallel& cp)
    : ep_(ep), tp_(tp), cp_(cp), parts_(spec.moe.parts), moe_(spec.moe), C_(spec.in), T_(spec.seq_len), fp8_(fp8_linear(spec, tp.comm)) {
  RELAY_ASSERT(cp_.size == moe_.cp, "MoeMlp: a cp group of " << cp_.size << " for a layer planned at cp " << moe_.cp);
  RELAY_ASSERT(moe_.on(), "MoeMlp: the block has no experts");
  RELAY_ASSERT(ep_.size == moe_.ep, "MoeMlp: an ep group of " << ep_.size << " for a layer planned at ep " << moe_.ep);
  E_local_ = ep_.local_experts(moe_.n_experts);
  first_ = ep_.first_expert(moe_.n_experts);
  RELAY_ASSERT(parts_ == 1 || (parts_ == 2 && ep_.on() && E_local_ >= 2),
               "MoeMlp: " << parts_ << " parts (1, or 2 under ep with two or more experts a rank)");
  RELAY_ASSERT(params.size() == param_count(moe_, ep_),
               "MoeMlp: " << params.size() << " params, expected " << param_count(moe_, ep_));
  RELAY_ASSERT(sigmoid() || (moe_.n_group == 1 && moe_.topk_group == 1 && moe_.routed_scaling == 1.0),
               "MoeMlp: group-limited routing and routed_scaling_factor need sigmoid scores");
  RELAY_ASSERT(!sigmoid() || moe_.z_weight == 0, "MoeMlp: the router z-loss needs softmax scores");
  router_ = params[0];
  size_t i = 1;
  if (moe_.n_shared > 0) {
    shared_gate_ = params[i++];
    shared_up_ = params[i++];
    shared_down_ = params[i++];
  }
  for (int64_t e = 0; e < E_local_; ++e) {
    gate_.push_back(params[i++]);
    up_.push_back(params[i++]);
    down_.push_back(params[i++]);
  }
  stats_.layer = moe_.layer;
  stats_.tokens.assign(size_t(moe_.n_experts), 0.0);
}

std::vector<BufferSpec> MoeMlp::saved_shapes(const BlockSpec& spec, int64_t n, int tp) {
  const int ep = spec.moe.ep;
  const int64_t P = spec.moe.parts, E = spec.moe.n_experts, k = spec.moe.k, F = spec.moe.ffn_hidden / tp, C = spec.in, R = n * k;
  // Rows this rank's experts may receive: each of the ep ranks' n tokens sends at most min(k, E / ep) of its rows here.
  const int64_t Rl = ep > 1 ? int64_t(ep) * n * std::min(k, E / ep) : R, Rx = ep > 1 ? Rl : 0;
  const DType a = spec.dtype, f32 = DType::f32, i32 = DType::i32;
  std::vector<BufferSpec> s(kCount);
  s[kLogits] = {{n, E}, a};
  s[kProbs] = {{n, E}, f32};
  s[kLse] = {{n}, f32};
  s[kExperts] = {{n, k}, i32};
  s[kWeights] = {{n, k}, f32};
  s[kPos] = {{n, k}, i32};      // row of (token t, its j-th expert) among the sorted rows
  s[kSrc] = {{R}, i32};         // token of each sorted row
  // Part h's expert e's rows: [offsets[h E + e], offsets[h E + e + 1]) (parts: MoeSpec::parts, 1 or 2)
  s[kOffsets] = {{P * E + 1}, i32};
  s[kXs] = {{R, C}, a};         // the tokens' rows, sorted by part, then expert
  s[kGate] = {{Rl, F}, a};      // this rank's experts' rows from here on
  s[kUp] = {{Rl, F}, a};
  s[kH] = {{Rl, F}, a};
  s[kYs] = {{R, C}, a};         // each expert's output, before its weight (sorted rows)
  s[kGYs] = {{R, C}, a, true};
  s[kGGate] = {{Rl, F}, a, true};
  s[kGUp] = {{Rl, F}, a, true};
  s[kGXs] = {{R, C}, a, true};
  s[kGWeights] = {{n, k}, f32, true};
  s[kGLogits] = {{n, E}, a, true};
  // d loss / d p[t, e] per sequence
  s[kSeqGrad] = {{std::max<int64_t>(n * spec.moe.cp / spec.seq_len, 1), E}, f32, true};
  // Expert parallelism only (size 0 otherwise): what each rank sent this rank's experts, the maps between the rows'
  // arrival order (rank after rank) and the experts' (expert after expert), the local rows and one staging buffer.
  s[kRecvCounts] = {{ep > 1 ? P * E : 0}, i32};  // (ep, parts, E / ep)
  s[kToLocal] = {{Rx}, i32};    // local row r is arrival row to_local[r]
  s[kToRanks] = {{Rx}, i32};    // arrival row i is local row to_ranks[i]
  s[kXl] = {{Rx, C}, a};
  s[kYl] = {{Rx, C}, a};
  s[kGYl] = {{Rx, C}, a, true};
  s[kGXl] = {{Rx, C}, a, true};
  s[kStage] = {{Rx, C}, a, true};  // rows in arrival order, on their way in or out
  // The shared experts (size 0 without them): their SwiGLU's gate, up (n, Fs) and output (scratch: the forward's, and
  // recomputed for down's weight gradient), the output gradient dy (n, C) backward_weight reads, d gate, d up.
  const int64_t ns = spec.moe.n_shared > 0 ? n : 0, Fs = spec.moe.shared_hidden() / tp;
  s[kSGate] = {{ns, Fs}, a};
  s[kSUp] = {{ns, Fs}, a};
  s[kSH] = {{ns, Fs}, a, true};
  s[kSGY] = {{ns, C}, a, true};
  s[kSGGate] = {{ns, Fs}, a, true};
  s[kSGUp] = {{ns, Fs}, a, true};
  return s;
}

int64_t MoeMlp::exchange_bytes(const BlockSpec& spec, int64_t n, int tp) {
  const std::vector<BufferSpec> s = saved_shapes(spec, n, tp);
  int64_t bytes = 0;
  for (size_t i = kRecvCounts; i <= kStage; ++i) bytes += s[i].bytes();
  return bytes;
}

void MoeMlp::make_exchange_plan() {
  const int P = ep_.size;
  const int64_t H = parts_, E = moe_.n_experts;
  local_.assign(size_t(H * E_local_ + 1), 0);
  if (!ep_.on()) {
    for (int64_t e = 0; e <= H * E_local_; ++e) local_[size_t(e)] = offsets_[size_t(e)];
    return;
  }
  send_rows_.assign(size_t(H * P), 0);
  recv_rows_.assign(size_t(H * P), 0);
  for (int64_t h = 0; h < H; ++h)
    for (int q = 0; q < P; ++q)
      send_rows_[size_t(h * P + q)] =
          offsets_[size_t(h * E + (q + 1) * E_local_)] - offsets_[size_t(h * E + q * E_local_)];
  for (int p = 0; p < P; ++p)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < E_local_; ++j) {
        const int32_t c = recv_counts_[size_t((p * H + h) * E_local_ + j)];
        recv_rows_[size_t(h * P + p)] += c;
        local_[size_t(h * E_local_ + j + 1)] += c;
      }
  for (int64_t j = 0; j < H * E_local_; ++j) local_[size_t(j + 1)] += local_[size_t(j)];
}

void MoeMlp::download_plan(Backend& be, Tensor* s) {
  offsets_.resize(size_t(parts_ * moe_.n_experts + 1));
  be.download(offsets_.data(), s[kOffsets]);
  if (ep_.on()) {
    recv_counts_.resize(size_t(parts_ * moe_.n_experts));
    be.download(recv_counts_.data(), s[kRecvCounts]);
  }
  make_exchange_plan();
}

std::vector<int64_t> MoeMlp::local_of(int64_t h) const {
  return {local_.begin() + h * E_local_, local_.begin() + (h + 1) * E_local_ + 1};
}

MoeMlp::RowRange MoeMlp::sorted_part(int64_t h) const {
  const int64_t E = moe_.n_experts, at = offsets_[size_t(h * E)];
  return {at, offsets_[size_t((h + 1) * E)] - at};
}

MoeMlp::RowRange MoeMlp::local_part(int64_t h) const {
  const int64_t base = local_[size_t(h * E_local_)];
  return {base, local_[size_t((h + 1) * E_local_)] - base};
}

MoeMlp::Exchange MoeMlp::start_dispatch(int64_t h, const Tensor& sorted, Tensor* s, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  const int P = ep_.size;
  const RowRange mine = sorted_part(h), arrivals = local_part(h);
  Exchange x{h, ep_.stats->tracer ? ep_.stats->tracer->mark() : 0, nullptr};
  Tensor stage = s[kStage].rows(arrivals.begin, arrivals.count);  // (Rh, C) rank after rank
  x.req = ep_.comm->ialltoall_rows(sorted.rows(mine.begin, mine.count), part_of(send_rows_, h, P), stage, part_of(recv_rows_, h, P),
                                   what);
  x.req->what = what;
  test_fault_point("ep");  // test only: a rank stopped or lost while it travels
  ep_.stats->seconds += since(t0);
  ep_.stats->rows_sent += mine.count - send_rows_[size_t(h * P + ep_.rank)];
  return x;
}

void MoeMlp::finish_dispatch(Backend& be, Exchange& x, Tensor& local, Tensor* s) {
  wait_exchange(x, "ep all-to-all");
  const RowRange r = local_part(x.part);
  Tensor dst = local.rows(r.begin, r.count);
  be.gather_rows(s[kStage], s[kToLocal].rows(r.begin, r.count), dst);  // (Rh, C) expert after expert
}

MoeMlp::Exchange MoeMlp::start_undispatch(Backend& be, int64_t h, const Tensor& local, Tensor& sorted, Tensor* s,
                                          const char* what) {
  const int P = ep_.size;
  const RowRange mine = sorted_part(h), arrivals = local_part(h);
  Tensor stage = s[kStage].rows(arrivals.begin, arrivals.count);
  be.gather_rows(local, s[kToRanks].rows(arrivals.begin, arrivals.count), stage);  // (Rh, C) rank after rank
  const auto t0 = std::chrono::steady_clock::now();
  Exchange x{h, ep_.stats->tracer ? ep_.stats->tracer->mark() : 0, nullptr};
  Tensor dst = sorted.rows(mine.begin, mine.count);
  x.req = ep_.comm->ialltoall_rows(stage, part_of(recv_rows_, h, P), dst, part_of(send_rows_, h, P), what);
  x.req->what = what;
  ep_.stats->seconds += since(t0);
  return x;
}

void MoeMlp::wait_exchange(Exchange& x, const char* name) {
  const auto t0 = std::chrono::steady_clock::now();
  x.req->wait();
  ep_.stats->seconds += since(t0);  // the time the rank's thread waited: all of it without overlap
  if (ep_.stats->tracer)
    ep_.stats->tracer->add({name, "ep_alltoall", kTrackComm, ep_.stats->trace_step, -1, -1, x.mark,
                            ep_.stats->tracer->mark()});
}

void MoeMlp::experts_forward(Backend& be, const Tensor& xl, int64_t h, Tensor* s) {
  // Every local expert of part h in one pass (a grouped GEMM): expert j's rows are [lo[j], lo[j + 1]) of xl; an expert
  // no token of the part chose has none.
  const std::vector<int64_t> lo = local_of(h);
  const int64_t R = local_rows();
  Tensor gate = s[kGate].rows(0, R), up = s[kUp].rows(0, R), hh = s[kH].rows(0, R);
  Tensor yl = ep_.on() ? s[kYl].rows(0, R) : s[kYs].rows(0, R);
  fp8_.grouped_matmul(be, xl, gate_, true, gate, lo, 0.f);                      // (Rl, F)
  fp8_.grouped_matmul(be, xl, up_, true, up, lo, 0.f);                          // (Rl, F)
  if (lo.back() > lo.front()) {
    Tensor hu = hh.rows(lo.front(), lo.back() - lo.front());
    be.swiglu_forward(gate.rows(lo.front(), lo.back() - lo.front()), up.rows(lo.front(), lo.back() - lo.front()),
                      hu);                                                                  // (rows, F)
  }
  fp8_.grouped_matmul(be, hh, down_, true, yl, lo, 0.f);                         // (Rl, C)
}

void MoeMlp::experts_backward(Backend& be, const Tensor& gyl, Tensor& gxl, int64_t h, Tensor* s) {
  const std::vector<int64_t> lo = local_of(h);
  const int64_t R = local_rows();
  Tensor ggate = s[kGGate].rows(0, R), gup = s[kGUp].rows(0, R);
  fp8_.grouped_matmul(be, gyl, down_, false, ggate, lo, 0.f);                    // (Rl, F) d h
  if (lo.back() > lo.front()) {
    const int64_t a = lo.front(), m = lo.back() - lo.front();
    Tensor gg = ggate.rows(a, m), gu = gup.rows(a, m);
    be.swiglu_backward(gg, s[kGate].rows(a, m), s[kUp].rows(a, m), gg, gu);                  // (rows, F) each
  }
  fp8_.grouped_matmul(be, ggate, gate_, false, gxl, lo, 0.f);                    // (Rl, C)
  fp8_.grouped_matmul(be, gup, up_, false, gxl, lo, 1.f);
}

void MoeMlp::forward(Backend& be, const Tensor& x, Tensor& y, Tensor* s) {
  const int64_t n = x.size(0), E = moe_.n_experts, k = moe_.k, R = n * k;
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  Tensor logits = rows(kLogits, n), probs = rows(kProbs, n), lse = rows(kLse, n), experts = rows(kExperts, n);
  Tensor weights = rows(kWeights, n), pos = rows(kPos, n), src = s[kSrc].rows(0, R), xs = rows(kXs, R);
  be.linear(x, router_->compute(), Tensor(), logits);                                   // (n, E)
  // moe.expert_bias: the bias the trainer (or relay generate) set; undefined, the router is unbiased.
  if (sigmoid()) {
    be.moe_group_router_forward(logits, group_routing(), probs, experts, weights, bias_);  // (n, E), (n, k) x 2
    be.fill(lse, 0.f);  // (n) no softmax: no z-loss
  } else {
    be.moe_router_forward(logits, k, moe_.renormalize, probs, lse, experts, weights, bias_);  // (n, E), (n), (n, k) x 2
  }
  // The routing plan on the host: a counting sort of the (token, j) pairs by part, then expert (stable: by token, then
  // by j). With parts_ = 2 (MoeSpec::parts) part 0 is the rows of each rank's first half of its experts, part 1 the
  // rest's: an expert's rows are all in one part, so the local rows come out as with one part (the same GEMMs).
  const int64_t H = parts_;
  auto key = [&](int64_t i) {
    const int32_t e = experts_[size_t(i)];
    return (H > 1 && e % E_local_ >= E_local_ / 2 ? E : 0) + e;
  };
  experts_.resize(size_t(R));
  be.download(experts_.data(), experts);
  offsets_.assign(size_t(H * E + 1), 0);
  for (int64_t i = 0; i < R; ++i) ++offsets_[size_t(key(i)) + 1];
  for (int64_t e = 0; e < H * E; ++e) offsets_[size_t(e + 1)] += offsets_[size_t(e)];
  pos_.resize(size_t(R));
  src_.resize(size_t(R));
  std::vector<int32_t> next(offsets_.begin(), offsets_.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    const int32_t r = next[size_t(key(i))]++;
    pos_[size_t(i)] = r;
    src_[size_t(r)] = int32_t(i / k);
  }
  be.upload(pos, pos_.data());
  be.upload(src, src_.data());
  be.upload(s[kOffsets], offsets_.data());
  be.gather_rows(x, src, xs);                                                           // (R, C)
  if (ep_.on()) {
    // Counts first: every rank learns how many rows of each part each rank sends each of its experts.
    const auto t0 = std::chrono::steady_clock::now();
    // (ep, parts, E / ep): to each rank's experts, by part; from each rank, by part
    std::vector<int64_t> mine(static_cast<size_t>(H * E)), theirs(static_cast<size_t>(H * E));
    for (int q = 0; q < ep_.size; ++q)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < E_local_; ++j) {
          const int64_t e = h * E + q * E_local_ + j;
          mine[size_t((q * H + h) * E_local_ + j)] = offsets_[size_t(e + 1)] - offsets_[size_t(e)];
        }
    ep_.comm->alltoall_host(mine.data(), theirs.data(), int(H * E_local_), "the expert-parallel row counts");
    ep_.stats->seconds += since(t0);
    recv_counts_.assign(theirs.begin(), theirs.end());
    be.upload(s[kRecvCounts], recv_counts_.data());
  }
  make_exchange_plan();
  const int64_t Rl = local_rows();
  Tensor xl = xs, ys = rows(kYs, R);
  const int64_t ns = moe_.n_shared > 0 ? n : 0;
  Tensor sgate = rows(kSGate, ns), sup = rows(kSUp, ns), sh = rows(kSH, ns);  // (n, Fs) each with shared experts
  auto shared_swiglu = [&] {
    if (moe_.n_shared == 0) return;
    fp8_.linear(be, x, *shared_gate_, Tensor(), sgate);                       // (n, Fs)
    fp8_.linear(be, x, *shared_up_, Tensor(), sup);                           // (n, Fs)
    be.swiglu_forward(sgate, sup, sh);                                                  // (n, Fs)
  };
  if (!ep_.on()) {
    experts_forward(be, xl, 0, s);  // (R, C) into ys
  } else {
    // Arrival order (part h's rows from rank p of local expert j at its arrival + p's earlier experts) <-> expert order.
    std::vector<int32_t> to_local(static_cast<size_t>(Rl)), to_ranks(static_cast<size_t>(Rl));
    std::vector<int64_t> at(local_.begin(), local_.end() - 1);  // next local row of each (part, expert)
    int64_t arrival = 0;
    for (int64_t h = 0; h < H; ++h)
      for (int p = 0; p < ep_.size; ++p)
        for (int64_t j = 0; j < E_local_; ++j)
          for (int32_t i = 0; i < recv_counts_[size_t((p * H + h) * E_local_ + j)]; ++i, ++arrival) {
            int64_t& row = at[size_t(h * E_local_ + j)];
            to_local[size_t(row)] = int32_t(arrival);
            to_ranks[size_t(arrival)] = int32_t(row++);
          }
    Tensor tl = s[kToLocal].rows(0, Rl), tr = s[kToRanks].rows(0, Rl);
    be.upload(tl, to_local.data());
    be.upload(tr, to_ranks.data());
    xl = rows(kXl, Rl);
    Tensor yl = rows(kYl, Rl);
    // Two parts: part 1's rows travel while part 0's experts run, part 0's outputs travel back while part 1's run
    // (the experts' work chunked in two: Relay's form of DeepSeek-V3's computation-communication overlap). One part:
    // today's order.
    std::vector<Exchange> in, out;
    for (int64_t h = 0; h < H; ++h)
      in.push_back(start_dispatch(h, xs, s, "the expert-parallel dispatch of the tokens' rows"));
    for (int64_t h = 0; h < H; ++h) {
      finish_dispatch(be, in[size_t(h)], xl, s);                                          // part h's (rows, C)
      experts_forward(be, xl, h, s);                                                       // into yl
      out.push_back(start_undispatch(be, h, yl, ys, s, "the expert-parallel return of the experts' outputs"));
    }
    // Two parts: the shared experts' SwiGLU (of x alone) while the last outputs travel back, as DeepSeek-V3 does.
    if (parts_ > 1) shared_swiglu();
    for (Exchange& x : out) wait_exchange(x, "ep all-to-all back");                       // (R, C)
  }
  be.moe_combine(ys, pos, weights, y);                                                  // (n, C)
  if (moe_.n_shared > 0) {  // y += shared(x): every token, this tp rank's Fs / tp units
    if (!(ep_.on() && parts_ > 1)) shared_swiglu();
    fp8_.matmul(be, sh, *shared_down_, true, y, 1.f);                         // (n, C)
  }
}

void MoeMlp::backward_input(Backend& be, const Tensor& dy, Tensor& dx, Tensor* s) {
  const int64_t n = dy.size(0), E = moe_.n_experts, k = moe_.k, R = n * k;
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  download_plan(be, s);
  const int64_t Rl = local_rows();
  Tensor gys = rows(kGYs, R), gweights = rows(kGWeights, n);
  Tensor gxs = rows(kGXs, R), glogits = rows(kGLogits, n);
  be.moe_combine_backward(dy, rows(kYs, R), rows(kPos, n), rows(kWeights, n), gys, gweights);  // (R, C), (n, k)
  // Under tp the outputs ys were this rank's partial sums, so the weights' gradients dy . ys are too.
  if (tp_.on()) tp_.allreduce_sum(gweights, "the expert weights' gradient all-reduce");
  std::vector<Exchange> returning;  // two parts: the inputs' gradients on their way back while the router's run
  if (!ep_.on()) {
    experts_backward(be, gys, gxs, 0, s);                                                 // (R, C)
  } else {
    // As the forward: part 1's outputs' gradients travel while part 0's experts run backward, and so on.
    Tensor gyl = rows(kGYl, Rl), gxl = rows(kGXl, Rl);
    std::vector<Exchange> in, out;
    for (int64_t h = 0; h < parts_; ++h)
      in.push_back(start_dispatch(h, gys, s, "the expert-parallel dispatch of the outputs' gradients"));
    for (int64_t h = 0; h < parts_; ++h) {
      finish_dispatch(be, in[size_t(h)], gyl, s);                                         // part h's (rows, C)
      experts_backward(be, gyl, gxl, h, s);
      out.push_back(start_undispatch(be, h, gxl, gxs, s, "the expert-parallel return of the inputs' gradients"));
    }
    if (parts_ > 1) returning = std::move(out);
    for (Exchange& x : out) wait_exchange(x, "ep all-to-all back");                       // (R, C)
  }
  // The load-balancing and z losses of this micro-batch's sequences (host statistics of the saved routing): Tl of a
  // sequence's T rows here (T / cp under context parallelism, whose group sums c and sum_t p first).
  const int64_t Tl = T_ / cp_.size, B = n / Tl;
  probs_.resize(size_t(n * E));
  lse_.resize(size_t(n));
  experts_.resize(size_t(R));
  plain_top_.resize(sigmoid() ? size_t(R) : 0);
  be.download(probs_.data(), rows(kProbs, n));
  be.download(lse_.data(), rows(kLse, n));
  be.download(experts_.data(), rows(kExperts, n));
  seq_grad_.assign(size_t(B * E), 0.f);
  const double norm = double(E) / (double(k) * double(T_) * double(T_));
  std::vector<double> cp_stats(static_cast<size_t>(2 * B * E), 0.0);  // (B, 2, E) per sequence: c, then sum_t p
  for (int64_t i = 0; i < n * k; ++i) stats_.tokens[size_t(experts_[size_t(i)])] += 1;  // this rank's tokens
  // Sequences on the threads (each writes its own statistics and tokens' plain top-k; the sums in the order above):
  // with DeepSeek-V3's top-k below, this loop and choice_margin's were ~0.2 ms of host time a step on a 1024-token
  // micro-batch, the other thread idle.
#pragma omp parallel for schedule(static) if (n >= kHostParallelTokens)
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> top;  // (k) a token's plain top-k
    double* c = cp_stats.data() + 2 * b * E;
    double* psum = c + E;
    for (int64_t t = b * Tl; t < (b + 1) * Tl; ++t) {
      const float* p = probs_.data() + t * E;
      if (!sigmoid()) {
        for (int64_t j = 0; j < k; ++j) c[experts_[size_t(t * k + j)]] += 1;
        for (int64_t e = 0; e < E; ++e) psum[e] += p[e];
        continue;
      }
      // DeepSeek-V3's complementary loss (report eq. 17-20, Megatron-core's sigmoid seq_aux_loss): its counts are of
      // the token's k best unbiased scores over all experts (no bias, no groups; the lower expert first on a tie),
      // its probabilities the scores normalised to sum 1 (as moe_group_router_backward differentiates them).
      plain_top_k(p, top);
      std::copy(top.begin(), top.end(), plain_top_.begin() + t * k);  // for choice_margin
      for (int64_t e : top) c[e] += 1;
      float D = 1e-20f;
      for (int64_t e = 0; e < E; ++e) D += p[e];
      for (int64_t e = 0; e < E; ++e) psum[e] += p[e] / D;
    }
  }
  if (cp_.on())
    cp_.comm->allreduce_host(cp_stats.data(), int(cp_stats.size()), ReduceOp::sum,
                             "the context-parallel sum of the load-balancing statistics");
  for (int64_t b = 0; b < B; ++b) {
    const double* c = cp_stats.data() + 2 * b * E;
    const double* psum = c + E;
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) {
      aux += c[e] * psum[e];
      seq_grad_[size_t(b * E + e)] = float(moe_.aux_weight * norm * c[e]);
    }
    if (cp_.rank == 0) stats_.aux_sum += norm * aux;  // each sequence once
  }
  for (float l : lse_) stats_.z_sum += double(l) * double(l);
  if (k < E) {
    double margin = stats_.min_margin;
#pragma omp parallel if (n >= kHostParallelTokens)
    {
      MarginScratch scratch;
#pragma omp for schedule(static) reduction(min : margin)
      for (int64_t t = 0; t < n; ++t) margin = std::min(margin, choice_margin(t, scratch));
    }
    stats_.min_margin = margin;
  }
  Tensor seq_grad = s[kSeqGrad].rows(0, B);
  be.upload(seq_grad, seq_grad_.data());
  if (sigmoid())
    be.moe_group_router_backward(rows(kProbs, n), rows(kExperts, n), gweights, group_routing(),
                                 moe_.aux_weight > 0 ? seq_grad : Tensor(), Tl, glogits);  // (n, E)
  else
    be.moe_router_backward(rows(kProbs, n), rows(kLse, n), rows(kExperts, n), gweights, moe_.renormalize,
                           moe_.aux_weight > 0 ? seq_grad : Tensor(), Tl, float(moe_.z_weight), glogits);  // (n, E)
  for (Exchange& x : returning) wait_exchange(x, "ep all-to-all back");                 // gxs (R, C)
  be.moe_combine(gxs, rows(kPos, n), Tensor(), dx);                                    // (n, C) through the experts
  if (tp_.rank == 0)  // + through the router (whole on every tp rank: counted once in the group's sum)
    be.matmul(glogits, false, router_->compute(), false, dx, 1.f, 1.f);
  if (moe_.n_shared > 0) {  // + through the shared experts (this tp rank's units: a partial sum like the experts')
    Tensor sgy = rows(kSGY, n), sgg = rows(kSGGate, n), sgu = rows(kSGUp, n);
    be.copy(sgy, dy);                                                                   // (n, C) for backward_weight
    fp8_.matmul(be, dy, *shared_down_, false, sgg);                           // (n, Fs) d h
    be.swiglu_backward(sgg, rows(kSGate, n), rows(kSUp, n), sgg, sgu);                  // (n, Fs) d gate, d up
    fp8_.matmul(be, sgg, *shared_gate_, false, dx, 1.f);                      // (n, C)
    fp8_.matmul(be, sgu, *shared_up_, false, dx, 1.f);
  }
}

void MoeMlp::backward_weight(Backend& be, const Tensor& x, Tensor* s) {
  const int64_t n = x.size(0);
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  download_plan(be, s);
  be.matmul(rows(kGLogits, n), true, x, false, router_->grad, 1.f, 1.f);               // dW_gate (E, C)
  if (moe_.n_shared > 0) {
    Tensor sh = rows(kSH, n);  // (n, Fs) recomputed from the kept gate and up, bitwise the forward's
    be.swiglu_forward(rows(kSGate, n), rows(kSUp, n), sh);
    fp8_.weight_grad(be, rows(kSGY, n), sh, shared_down_->grad);                        // dW_down (C, Fs)
    fp8_.weight_grad(be, rows(kSGGate, n), x, shared_gate_->grad);                      // dW_gate (Fs, C)
    fp8_.weight_grad(be, rows(kSGUp, n), x, shared_up_->grad);                          // dW_up (Fs, C)
  }
  const size_t xl = ep_.on() ? kXl : kXs, gyl = ep_.on() ? kGYl : kGYs;  // this rank's experts' rows
  const int64_t Rl = local_rows();
  const Tensor xe = s[xl].rows(0, Rl);                                                  // (Rl, C)
  // Two parts: each expert's rows are in one of them, in the one-part order (the local rows are laid out as with one
  // part): every expert's weight gradient is one GEMM over the same rows, as with parallel.overlap = false.
  for (int64_t h = 0; h < parts_; ++h) {
    const std::vector<int64_t> lo = local_of(h);
    fp8_.grouped_weight_grad(be, s[gyl].rows(0, Rl), rows(kH, Rl), lo, grads_of(down_));  // dW_down (C, F) each
    fp8_.grouped_weight_grad(be, rows(kGGate, Rl), xe, lo, grads_of(gate_));              // dW_gate (F, C) each
    fp8_.grouped_weight_grad(be, rows(kGUp, Rl), xe, lo, grads_of(up_));                  // dW_up (F, C) each
  }
}

void MoeMlp::plain_top_k(const float* p, std::vector<int64_t>& top) const {
  top.clear();  // (k)
  for (int64_t j = 0; j < moe_.k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < moe_.n_experts; ++e)
      if (std::find(top.begin(), top.end(), e) == top.end() && (best < 0 || p[e] > p[best])) best = e;
    top.push_back(best);
  }
}

double MoeMlp::choice_margin(int64_t t, MarginScratch& scratch) const {
  const int64_t E = moe_.n_experts, k = moe_.k, G = E / moe_.n_group, NG = moe_.n_group;
  const float* p = probs_.data() + t * E;
  auto score = [&](int64_t e) { return host_bias_.empty() ? p[e] : p[e] + host_bias_[size_t(e)]; };
  const auto first = experts_.begin() + t * k, last = first + k;
  auto chosen = [&](int64_t e) { return std::find(first, last, int32_t(e)) != last; };
  // Group-limited routing: the groups ranked again by the sum of their two best choice scores; the margin is also
  // the one between the worst kept group and the best dropped one.
  std::vector<char>& kept = scratch.kept;
  kept.assign(static_cast<size_t>(NG), 1);
  double margin = INFINITY;
  if (NG != moe_.topk_group) {
    std::vector<double>& gscore = scratch.gscore;
    std::vector<int64_t>& order = scratch.order;
    gscore.resize(static_cast<size_t>(NG));
    order.resize(static_cast<size_t>(NG));
    for (int64_t g = 0; g < NG; ++g) {
      float best = -INFINITY, second = -INFINITY;  // the group's two largest scores (equal ones both counted)
      for (int64_t e = g * G; e < (g + 1) * G; ++e) {
        const float x = score(e);
        if (x > best) {
          second = best;
          best = x;
        } else if (x > second) {
          second = x;
        }
      }
      gscore[size_t(g)] = G > 1 ? double(best + second) : double(best);
      order[size_t(g)] = g;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return gscore[size_t(a)] > gscore[size_t(b)]; });
    for (int64_t j = 0; j < NG; ++j) kept[size_t(order[size_t(j)])] = j < moe_.topk_group;
    margin = gscore[size_t(order[size_t(moe_.topk_group - 1)])] - gscore[size_t(order[size_t(moe_.topk_group)])];
  }
  // The k-th largest choice score is the smallest chosen one; the (k+1)-th the largest of the kept rest.
  float kth = INFINITY, next = -INFINITY;
  for (int64_t j = 0; j < k; ++j) kth = std::min(kth, score(first[j]));
  for (int64_t e = 0; e < E; ++e)
    if (kept[size_t(e / G)] && !chosen(e)) next = std::max(next, score(e));
  margin = std::min(margin, double(kth) - double(next));
  if (sigmoid() && moe_.aux_weight > 0) {  // the aux loss's own top-k of the unbiased scores, over all experts
    const auto top = plain_top_.begin() + t * k, top_end = top + k;  // backward_input's plain_top_k of token t
    float last = INFINITY, rest = -INFINITY;
    for (int64_t e = 0; e < E; ++e)
      if (std::find(top, top_end, e) != top_end) last = std::min(last, p[e]);
      else rest = std::max(rest, p[e]);
    margin = std::min(margin, double(last) - double(rest));
  }
  return margin;
}

void MoeMlp::set_bias(Backend& be, const float* bias) {
  if (!bias_.defined()) bias_ = Tensor(be, {moe_.n_experts});
  host_bias_.assign(bias, bias + moe_.n_experts);
  be.upload(bias_, host_bias_.data());
}

void MoeMlp::take_stats(std::vector<RouterStats>& out) {
  out.push_back(stats_);
  stats_.aux_sum = stats_.z_sum = 0;
  stats_.min_margin = INFINITY;
  std::fill(stats_.tokens.begin(), stats_.tokens.end(), 0.0);
}

}  // namespace relay
