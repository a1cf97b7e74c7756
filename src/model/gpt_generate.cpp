#include "model/gpt_generate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/rng.hpp"

namespace relay {

GptGenerator::GptGenerator(Backend& be, const Config& cfg, ParamStore& store) : be_(be), m_(cfg.model), store_(store) {
  const int64_t C = m_.n_embd, T = m_.block_size, V = m_.vocab_size;
  const DType dt = compute_dtype(cfg.train.precision);  // activations follow the run's precision
  for (int64_t l = 0; l < m_.n_layer; ++l) {
    kcache_.emplace_back(be, Shape{1, T, C}, dt);
    vcache_.emplace_back(be, Shape{1, T, C}, dt);
  }
  tok_ = Tensor(be, {1}, DType::i32);
  x_ = Tensor(be, {1, C}, dt);          // the residual stream
  ln_ = Tensor(be, {1, C}, dt);
  mean_ = Tensor(be, {1});
  rstd_ = Tensor(be, {1});
  qkv_ = Tensor(be, {1, 3 * C}, dt);
  atty_ = Tensor(be, {1, C}, dt);
  y_ = Tensor(be, {1, C}, dt);
  fcg_ = Tensor(be, {1, 4 * C}, dt);
  logits_ = Tensor(be, {1, V}, dt);
  logits_f32_ = Tensor(be, {1, V});
  zero_ = Tensor(be, {C}, dt);
  be.fill(zero_, 0.f);
}

Param& GptGenerator::p(const std::string& name) {
  Param* q = store_.find(name);
  RELAY_ASSERT(q, "generation needs parameter " << name);
  return *q;
}

const std::vector<float>& GptGenerator::step(int32_t tok, int64_t t) {
  const float eps = 1e-5f;
  be_.upload(tok_, &tok);
  Tensor wpe_t = p("transformer.wpe.weight").compute().rows(t, 1);  // (1, C): position t
  be_.embedding_forward(tok_, p("transformer.wte.weight").compute(), wpe_t, 1, x_);
  auto bias = [&](const std::string& n) -> const Tensor* { return m_.bias ? &p(n).compute() : nullptr; };
  auto linear = [&](const Tensor& in, const std::string& w, const std::string& b, Tensor& out,
                    LinearAct act = LinearAct::none) {
    be_.linear(in, p(w).compute(), m_.bias ? p(b).compute() : Tensor(), out, act);  // no pre-activation kept
  };
  auto layernorm = [&](const Tensor& in, const std::string& pre, Tensor& out) {
    const Tensor* b = bias(pre + ".bias");
    be_.layernorm_forward(in, p(pre + ".weight").compute(), b ? *b : zero_, eps, out, mean_, rstd_);
  };
  for (int64_t l = 0; l < m_.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    layernorm(x_, h + "ln_1", ln_);
    linear(ln_, h + "attn.c_attn.weight", h + "attn.c_attn.bias", qkv_);       // (1, 3C)
    be_.attention_decode(qkv_, kcache_[static_cast<size_t>(l)], vcache_[static_cast<size_t>(l)], t, m_.n_head, atty_);
    linear(atty_, h + "attn.c_proj.weight", h + "attn.c_proj.bias", y_);
    be_.add(x_, y_, x_);
    layernorm(x_, h + "ln_2", ln_);
    linear(ln_, h + "mlp.c_fc.weight", h + "mlp.c_fc.bias", fcg_, LinearAct::gelu_tanh);  // (1, 4C)
    linear(fcg_, h + "mlp.c_proj.weight", h + "mlp.c_proj.bias", y_);
    be_.add(x_, y_, x_);
  }
  layernorm(x_, "transformer.ln_f", ln_);
  const std::string head = m_.tie_embeddings ? "transformer.wte.weight" : "lm_head.weight";
  be_.matmul(ln_, false, p(head).compute(), true, logits_, 1.f, 0.f);  // (1, V)
  be_.convert(logits_, logits_f32_);
  host_logits_.resize(static_cast<size_t>(m_.vocab_size));
  be_.download(host_logits_.data(), logits_f32_);
  return host_logits_;
}

int32_t GptGenerator::sample(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t draw) {
  const size_t V = logits.size();
  if (opt.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> z(V);
  for (size_t i = 0; i < V; ++i) z[i] = double(logits[i]) / opt.temperature;
  if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < V) {  // keep the k largest, as torch.topk does
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<size_t>(opt.top_k - 1)];
    for (auto& v : z) if (v < kth) v = -INFINITY;
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (auto& v : z) sum += (v = std::exp(v - mx));
  Rng rng(opt.seed, draw);  // one stream per generated token: the same seed gives the same text
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < V; ++i) {
    if ((u -= z[i]) < 0) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(V - 1);
}

std::vector<int32_t> GptGenerator::generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt) {
  RELAY_ASSERT(!prompt.empty(), "generation needs at least one prompt token");
  const int64_t T = m_.block_size;
  std::vector<int32_t> seq = prompt;
  int64_t cached = 0;  // positions of seq in the cache, counted from `base`
  size_t base = 0;     // seq index of cache position 0
  for (int64_t k = 0; k < opt.max_new_tokens; ++k) {
    if (static_cast<int64_t>(seq.size()) > T) {  // crop to the last T tokens and rebuild the cache
      base = seq.size() - static_cast<size_t>(T);
      cached = 0;
    }
    const std::vector<float>* logits = nullptr;
    for (; base + static_cast<size_t>(cached) < seq.size(); ++cached)
      logits = &step(seq[base + static_cast<size_t>(cached)], cached);
    seq.push_back(sample(*logits, opt, static_cast<uint64_t>(k)));
  }
  return seq;
}

}  // namespace relay
