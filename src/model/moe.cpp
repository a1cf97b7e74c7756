// The sparse MLP of Mixtral and Qwen3-MoE decoder layers (model/moe.hpp).
#include "model/moe.hpp"

#include <algorithm>

namespace relay {

namespace {
// An expert's rows [0, count) in pieces of power-of-two sizes >= 16 and one remainder below 16 (count's binary
// digits): oneDNN caches a primitive per GEMM shape and creating one costs milliseconds, so the row counts of the
// experts' GEMMs, different every micro-batch, take at most log2(rows) + 16 shapes instead of one each.
template <typename F>
void by_pieces(int64_t count, F&& f) {
  int64_t at = 0;
  for (int64_t bit = int64_t(1) << 40; bit >= 16; bit >>= 1)
    if (count & bit) f(at, bit), at += bit;
  if (count > at) f(at, count - at);
}

// Saved buffers of one micro-batch of n tokens, R = n k routed rows (MoeMlp::saved_shapes).
enum : size_t { kLogits, kProbs, kLse, kExperts, kWeights, kPos, kSrc, kOffsets, kXs, kGate, kUp, kH, kYs,
                kGYs, kGGate, kGUp, kGXs, kGWeights, kGLogits, kSeqGrad, kCount };
}  // namespace

MoeMlp::MoeMlp(const BlockSpec& spec, std::span<Param* const> params)
    : moe_(spec.moe), C_(spec.in), T_(spec.seq_len) {
  RELAY_ASSERT(moe_.on(), "MoeMlp: the block has no experts");
  RELAY_ASSERT(int64_t(params.size()) == 1 + 3 * moe_.n_experts,
               "MoeMlp: " << params.size() << " params, expected " << 1 + 3 * moe_.n_experts);
  router_ = params[0];
  for (int64_t e = 0; e < moe_.n_experts; ++e) {
    gate_.push_back(params[size_t(1 + 3 * e)]);
    up_.push_back(params[size_t(2 + 3 * e)]);
    down_.push_back(params[size_t(3 + 3 * e)]);
  }
  stats_.layer = moe_.layer;
  stats_.tokens.assign(size_t(moe_.n_experts), 0.0);
}

std::vector<BufferSpec> MoeMlp::saved_shapes(const BlockSpec& spec, int64_t n) {
  const int64_t E = spec.moe.n_experts, k = spec.moe.k, F = spec.moe.ffn_hidden, C = spec.in, R = n * k;
  const DType a = spec.dtype, f32 = DType::f32, i32 = DType::i32;
  std::vector<BufferSpec> s(kCount);
  s[kLogits] = {{n, E}, a};
  s[kProbs] = {{n, E}, f32};
  s[kLse] = {{n}, f32};
  s[kExperts] = {{n, k}, i32};
  s[kWeights] = {{n, k}, f32};
  s[kPos] = {{n, k}, i32};      // row of (token t, its j-th expert) among the sorted rows
  s[kSrc] = {{R}, i32};         // token of each sorted row
  s[kOffsets] = {{E + 1}, i32}; // expert e's rows: [offsets[e], offsets[e + 1])
  s[kXs] = {{R, C}, a};         // the tokens' rows, sorted by expert
  s[kGate] = {{R, F}, a};
  s[kUp] = {{R, F}, a};
  s[kH] = {{R, F}, a};
  s[kYs] = {{R, C}, a};         // each expert's output, before its weight
  s[kGYs] = {{R, C}, a};
  s[kGGate] = {{R, F}, a};
  s[kGUp] = {{R, F}, a};
  s[kGXs] = {{R, C}, a};
  s[kGWeights] = {{n, k}, f32};
  s[kGLogits] = {{n, E}, a};
  s[kSeqGrad] = {{std::max<int64_t>(n / spec.seq_len, 1), E}, f32};  // d loss / d p[t, e] of each sequence
  return s;
}

void MoeMlp::download_offsets(Backend& be, Tensor* s) {
  offsets_.resize(size_t(moe_.n_experts + 1));
  be.download(offsets_.data(), s[kOffsets]);
}

void MoeMlp::forward(Backend& be, const Tensor& x, Tensor& y, Tensor* s) {
  const int64_t n = x.size(0), E = moe_.n_experts, k = moe_.k, R = n * k;
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  Tensor logits = rows(kLogits, n), probs = rows(kProbs, n), lse = rows(kLse, n), experts = rows(kExperts, n);
  Tensor weights = rows(kWeights, n), pos = rows(kPos, n), src = s[kSrc].rows(0, R), xs = rows(kXs, R);
  be.linear(x, router_->compute(), Tensor(), logits);                                   // (n, E)
  // moe.expert_bias: the bias the trainer (or relay generate) set; undefined, the router is unbiased.
  be.moe_router_forward(logits, k, moe_.renormalize, probs, lse, experts, weights, bias_);  // (n, E), (n), (n, k) x 2
  // The routing plan on the host: a counting sort of the (token, j) pairs by expert.
  experts_.resize(size_t(R));
  be.download(experts_.data(), experts);
  offsets_.assign(size_t(E + 1), 0);
  for (int32_t e : experts_) ++offsets_[size_t(e) + 1];
  for (int64_t e = 0; e < E; ++e) offsets_[size_t(e + 1)] += offsets_[size_t(e)];
  pos_.resize(size_t(R));
  src_.resize(size_t(R));
  std::vector<int32_t> next(offsets_.begin(), offsets_.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    const int32_t r = next[size_t(experts_[size_t(i)])]++;
    pos_[size_t(i)] = r;
    src_[size_t(r)] = int32_t(i / k);
  }
  be.upload(pos, pos_.data());
  be.upload(src, src_.data());
  be.upload(s[kOffsets], offsets_.data());
  be.gather_rows(x, src, xs);                                                           // (R, C)
  Tensor gate = rows(kGate, R), up = rows(kUp, R), h = rows(kH, R), ys = rows(kYs, R);
  for (int64_t e = 0; e < E; ++e)  // an expert no token chose this micro-batch has no piece
    by_pieces(count(e), [&](int64_t at, int64_t len) {
      const int64_t r = offsets_[size_t(e)] + at;
      Tensor xe = xs.rows(r, len), ge = gate.rows(r, len), ue = up.rows(r, len), he = h.rows(r, len);
      Tensor ye = ys.rows(r, len);
      be.linear(xe, gate_[size_t(e)]->compute(), Tensor(), ge);                         // (len, F)
      be.linear(xe, up_[size_t(e)]->compute(), Tensor(), ue);                           // (len, F)
      be.swiglu_forward(ge, ue, he);                                                      // (len, F)
      be.linear(he, down_[size_t(e)]->compute(), Tensor(), ye);                         // (len, C)
    });
  be.moe_combine(ys, pos, weights, y);                                                  // (n, C)
}

void MoeMlp::backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, Tensor* s) {
  const int64_t n = x.size(0), E = moe_.n_experts, k = moe_.k, R = n * k;
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  download_offsets(be, s);
  Tensor gys = rows(kGYs, R), gweights = rows(kGWeights, n), ggate = rows(kGGate, R), gup = rows(kGUp, R);
  Tensor gxs = rows(kGXs, R), glogits = rows(kGLogits, n);
  be.moe_combine_backward(dy, rows(kYs, R), rows(kPos, n), rows(kWeights, n), gys, gweights);  // (R, C), (n, k)
  for (int64_t e = 0; e < E; ++e)
    by_pieces(count(e), [&](int64_t at, int64_t len) {
      const int64_t r = offsets_[size_t(e)] + at;
      Tensor gg = ggate.rows(r, len), gu = gup.rows(r, len), gx = gxs.rows(r, len);
      be.matmul(gys.rows(r, len), false, down_[size_t(e)]->compute(), false, gg, 1.f, 0.f);  // (len, F) d h
      be.swiglu_backward(gg, s[kGate].rows(r, len), s[kUp].rows(r, len), gg, gu);
      be.matmul(gg, false, gate_[size_t(e)]->compute(), false, gx, 1.f, 0.f);                 // (len, C)
      be.matmul(gu, false, up_[size_t(e)]->compute(), false, gx, 1.f, 1.f);
    });
  // The load-balancing and z losses of this micro-batch's sequences (host statistics of the saved routing).
  const int64_t B = n / T_;
  probs_.resize(size_t(n * E));
  lse_.resize(size_t(n));
  experts_.resize(size_t(R));
  be.download(probs_.data(), rows(kProbs, n));
  be.download(lse_.data(), rows(kLse, n));
  be.download(experts_.data(), rows(kExperts, n));
  seq_grad_.assign(size_t(B * E), 0.f);
  const double norm = double(E) / (double(k) * double(T_) * double(T_));
  std::vector<double> c(static_cast<size_t>(E)), psum(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(c.begin(), c.end(), 0.0);
    std::fill(psum.begin(), psum.end(), 0.0);
    for (int64_t t = b * T_; t < (b + 1) * T_; ++t) {
      for (int64_t j = 0; j < k; ++j) c[size_t(experts_[size_t(t * k + j)])] += 1;
      for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += probs_[size_t(t * E + e)];
    }
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) {
      aux += c[size_t(e)] * psum[size_t(e)];
      seq_grad_[size_t(b * E + e)] = float(moe_.aux_weight * norm * c[size_t(e)]);
      stats_.tokens[size_t(e)] += c[size_t(e)];
    }
    stats_.aux_sum += norm * aux;
  }
  for (float l : lse_) stats_.z_sum += double(l) * double(l);
  if (k < E)  // the k-th largest probability is the smallest chosen one; the (k+1)-th the largest of the rest
    for (int64_t t = 0; t < n; ++t) {
      const float* p = probs_.data() + t * E;
      auto score = [&](int64_t e) { return host_bias_.empty() ? p[e] : p[e] + host_bias_[size_t(e)]; };
      float kth = INFINITY, next = -INFINITY;
      for (int64_t j = 0; j < k; ++j) kth = std::min(kth, score(experts_[size_t(t * k + j)]));
      for (int64_t e = 0; e < E; ++e)
        if (std::find(experts_.begin() + t * k, experts_.begin() + (t + 1) * k, int32_t(e)) == experts_.begin() + (t + 1) * k)
          next = std::max(next, score(e));
      stats_.min_margin = std::min(stats_.min_margin, double(kth) - double(next));
    }
  Tensor seq_grad = s[kSeqGrad].rows(0, B);
  be.upload(seq_grad, seq_grad_.data());
  be.moe_router_backward(rows(kProbs, n), rows(kLse, n), rows(kExperts, n), gweights, moe_.renormalize,
                         moe_.aux_weight > 0 ? seq_grad : Tensor(), T_, float(moe_.z_weight), glogits);  // (n, E)
  be.moe_combine(gxs, rows(kPos, n), Tensor(), dx);                                    // (n, C) through the experts
  be.matmul(glogits, false, router_->compute(), false, dx, 1.f, 1.f);                  // + through the router
}

void MoeMlp::backward_weight(Backend& be, const Tensor& x, Tensor* s) {
  const int64_t n = x.size(0), E = moe_.n_experts;
  auto rows = [&](size_t b, int64_t r) { return s[b].rows(0, r); };
  download_offsets(be, s);
  be.matmul(rows(kGLogits, n), true, x, false, router_->grad, 1.f, 1.f);               // dW_gate (E, C)
  for (int64_t e = 0; e < E; ++e)
    by_pieces(count(e), [&](int64_t at, int64_t len) {
      const int64_t r = offsets_[size_t(e)] + at;
      const Tensor xe = s[kXs].rows(r, len);
      be.matmul(s[kGYs].rows(r, len), true, s[kH].rows(r, len), false, down_[size_t(e)]->grad, 1.f, 1.f);
      be.matmul(s[kGGate].rows(r, len), true, xe, false, gate_[size_t(e)]->grad, 1.f, 1.f);
      be.matmul(s[kGUp].rows(r, len), true, xe, false, up_[size_t(e)]->grad, 1.f, 1.f);
    });
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
