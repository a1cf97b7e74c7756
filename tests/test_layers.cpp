// Every layer's backward (input and weight gradients) against central finite differences of a
// double-precision re-implementation of its forward, as torch.autograd.gradcheck does.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "backend/backend.hpp"
#include "core/rng.hpp"
#include "model/families/llama.hpp"
#include "model/families/mlp.hpp"
#include "model/family.hpp"
#include "model/generate.hpp"
#include "model/model_spec.hpp"
#include "support/test_support.hpp"

using namespace relay;

namespace {

using Vec = std::vector<double>;

// Double-precision forward of each layer type given x (rows, in) and the parameters.
Vec forward_double(const std::string& type, const Vec& x, int64_t rows, int64_t in, int64_t out, const Vec& w, const Vec& b) {
  Vec y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    if (type == "linear") {
      for (int64_t o = 0; o < out; ++o) {
        double s = b[size_t(o)];
        for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
        y[size_t(r * out + o)] = s;
      }
    } else if (type == "layernorm") {
      double mu = 0, var = 0;
      for (int64_t i = 0; i < in; ++i) mu += x[size_t(r * in + i)];
      mu /= double(in);
      for (int64_t i = 0; i < in; ++i) var += std::pow(x[size_t(r * in + i)] - mu, 2);
      var /= double(in);
      for (int64_t i = 0; i < in; ++i)
        y[size_t(r * in + i)] = (x[size_t(r * in + i)] - mu) / std::sqrt(var + 1e-5) * w[size_t(i)] + b[size_t(i)];
    } else {
      for (int64_t i = 0; i < in; ++i) {
        double v = x[size_t(r * in + i)];
        y[size_t(r * in + i)] = type == "relu" ? (v > 0 ? v : 0) : type == "tanh" ? std::tanh(v)
                                                                  : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      }
    }
  }
  return y;
}

void gradcheck(const LayerConfig& cfg, int64_t rows, int64_t in) {
  auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
  Config mc;
  mc.model.edit_args<MlpArgs>().layers = {cfg};
  const BlockSpec spec = make_model_spec(mc, in).blocks.at(0);
  struct { int64_t in, out; } s{spec.in, spec.out};
  ParamStore store(*be, 7);
  auto layer = make_block(spec, store);
  Rng rng(5, 1);
  Vec x(size_t(rows * in)), R(size_t(rows * s.out));  // loss = sum(y * R)
  for (auto& v : x) v = rng.normal() * 1.5;
  for (auto& v : R) v = rng.normal();
  Vec w, b;
  const auto& ps = layer->params();
  if (!ps.empty()) {
    // Random, non-trivial parameters (layernorm starts at 1 and 0).
    for (Param* pp : ps) {
      Param& p = *pp;
      std::vector<float> h(size_t(p.value.numel()));
      for (auto& v : h) v = float(rng.normal() * 0.5 + (p.name.find("weight") != std::string::npos && cfg.type == "layernorm" ? 1.0 : 0.0));
      be->upload(p.value, h.data());
      p.grad = Tensor(*be, p.value.shape());
      be->fill(p.grad, 0.f);
      (p.name.find("weight") != std::string::npos ? w : b) = Vec(h.begin(), h.end());
    }
  }
  // Analytic gradients from the float layer.
  std::vector<float> xf(x.begin(), x.end()), Rf(R.begin(), R.end());
  Tensor tx(*be, {rows, in}), ty(*be, {rows, s.out}), tdy(*be, {rows, s.out}), tdx(*be, {rows, in});
  be->upload(tx, xf.data());
  be->upload(tdy, Rf.data());
  BlockSaved saved;
  layer->allocate_saved(*be, rows, saved);
  layer->forward(*be, tx, ty, saved);
  layer->backward_input(*be, tx, tdy, tdx, saved);
  layer->backward_weight(*be, tx, tdy, saved);
  // The float forward agrees with the double one.
  std::vector<float> yf(size_t(ty.numel()));
  be->download(yf.data(), ty);
  Vec yd = forward_double(cfg.type, x, rows, in, s.out, w, b);
  for (size_t i = 0; i < yf.size(); ++i) ASSERT_NEAR(yf[i], yd[i], 1e-4 * (1 + std::abs(yd[i]))) << cfg.type << " y " << i;

  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    Vec y = forward_double(cfg.type, xx, rows, in, s.out, ww, bb);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * R[i];
    return l;
  };
  const double h = 1e-6;
  auto check = [&](Vec& v, const Tensor& analytic, const char* what) {
    std::vector<float> g(size_t(analytic.numel()));
    be->download(g.data(), analytic);
    for (size_t i = 0; i < v.size(); ++i) {
      double keep = v[i];
      v[i] = keep + h;
      double lp = loss(x, w, b);
      v[i] = keep - h;
      double lm = loss(x, w, b);
      v[i] = keep;
      double num = (lp - lm) / (2 * h);
      ASSERT_NEAR(g[i], num, 2e-4 * (1 + std::abs(num))) << cfg.type << " d" << what << "[" << i << "]";
    }
  };
  if (cfg.type != "relu") check(x, tdx, "x");  // relu's kink makes central differences unreliable at 0 only;
  else {                                         // away from 0 it is exact, checked directly:
    std::vector<float> g(size_t(tdx.numel()));
    be->download(g.data(), tdx);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(g[i], x[i] > 0 ? Rf[i] : 0.f);
  }
  if (!ps.empty()) {
    check(w, ps[0]->grad, "weight");
    check(b, ps[1]->grad, "bias");
  }
}

}  // namespace

TEST(LayerGradcheck, Linear) { gradcheck({"linear", 7, 1e-5}, 5, 9); }
TEST(LayerGradcheck, Gelu) { gradcheck({"gelu", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, Tanh) { gradcheck({"tanh", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, Relu) { gradcheck({"relu", 0, 1e-5}, 4, 11); }
TEST(LayerGradcheck, LayerNorm) { gradcheck({"layernorm", 0, 1e-5}, 6, 13); }

TEST(LayerInit, TorchDefaultsAndPureFunctionOfSeedAndIndex) {
  Config c;
  c.model.edit_args<MlpArgs>().layers = {{"relu", 0, 1e-5}, {"relu", 0, 1e-5}, {"linear", 64, 1e-5},
                                         {"linear", 64, 1e-5}, {"layernorm", 0, 1e-5}};
  const ModelSpec m = make_model_spec(c, 100);
  const ParamSpec& w2 = m.blocks[2].params[0];
  ParamSpec w3 = m.blocks[2].params[0];
  w3.init.stream = 3;  // the same layer at index 3
  auto wa = initial_values(w2, 9), wb = initial_values(w2, 9), wc = initial_values(w3, 9);
  EXPECT_EQ(wa, wb);  // same (seed, index): same values, whatever else exists
  EXPECT_NE(wa, wc);  // another index: other values
  ASSERT_EQ(wa.size(), 6400u);
  double bound = 1.0 / std::sqrt(100.0), mean = 0, sq = 0;
  for (float v : wa) {
    EXPECT_LE(std::abs(v), bound);
    mean += v;
    sq += double(v) * v;
  }
  mean /= 6400;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / 6400, bound * bound / 3, 0.1 * bound * bound / 3);  // variance of U(-b, b)
  for (float v : initial_values(m.blocks[4].params[0], 9)) EXPECT_EQ(v, 1.f);
  for (float v : initial_values(m.blocks[4].params[1], 9)) EXPECT_EQ(v, 0.f);
  EXPECT_EQ(w2.name, "2.weight");
  EXPECT_EQ(m.blocks[2].params[1].name, "2.bias");
  // The bias continues the weight's stream: the draws after the weight's 6400.
  Rng rng(9, 2);
  for (int i = 0; i < 6400; ++i) rng.next_u64();
  EXPECT_EQ(initial_values(m.blocks[2].params[1], 9)[0], float(rng.uniform(-bound, bound)));
}

Config gpt_config(int64_t layers, bool tie) {
  Config c;
  c.model.type = "gpt";
  c.model.vocab_size = 50257;
  c.model.block_size = 1024;
  c.model.n_layer = layers;
  c.model.n_head = 12;
  c.model.n_embd = 768;
  c.model.tie_embeddings = tie;
  return c;
}

TEST(GptSpec, Gpt2SmallHasNanoGptNamesShapesAndParameterCount) {
  const ModelSpec m = make_model_spec(gpt_config(12, true), 0);
  ASSERT_EQ(m.blocks.size(), 14u);  // embedding, 12 transformer blocks, head
  EXPECT_EQ(m.blocks.front().kind, BlockKind::embedding);
  EXPECT_EQ(m.blocks.back().kind, BlockKind::head);
  int64_t n = 0;
  std::set<std::string> seen;
  for (auto& b : m.blocks)
    for (auto& p : b.params)
      if (seen.insert(p.name).second) n += shape_numel(p.shape);
  EXPECT_EQ(n, 124439808);  // GPT-2 124M with tied embeddings, as nanoGPT counts it (wpe included)
  EXPECT_EQ(m.blocks[1].params[2].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(m.blocks[1].params[2].shape, (Shape{2304, 768}));
  EXPECT_EQ(m.blocks.back().params.back().name, "transformer.wte.weight");  // tied head
  const ModelSpec u = make_model_spec(gpt_config(12, false), 0);
  EXPECT_EQ(u.blocks.back().params.back().name, "lm_head.weight");
}

TEST(GptSpec, InitialisationIsGpt2sAndAPureFunctionOfSeedAndName) {
  Config c = gpt_config(4, true);
  c.model.vocab_size = 300;
  c.model.block_size = 64;
  c.model.n_embd = 96;
  c.model.n_head = 4;
  const ModelSpec m = make_model_spec(c, 0);
  auto stddev = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / double(v.size()));
  };
  const auto& blk = m.blocks[1].params;  // ln_1.w, ln_1.b, c_attn.w, c_attn.b, c_proj.w, c_proj.b, ...
  EXPECT_NEAR(stddev(initial_values(blk[2], 1)), 0.02, 0.002);
  EXPECT_NEAR(stddev(initial_values(blk[4], 1)), 0.02 / std::sqrt(8.0), 0.001);   // attn.c_proj
  EXPECT_NEAR(stddev(initial_values(blk[10], 1)), 0.02 / std::sqrt(8.0), 0.001);  // mlp.c_proj
  for (float v : initial_values(blk[3], 1)) EXPECT_EQ(v, 0.f);
  for (float v : initial_values(blk[0], 1)) EXPECT_EQ(v, 1.f);
  // The head's tied weight initialises exactly as the embedding's (two stages hold equal copies).
  EXPECT_EQ(initial_values(m.blocks.back().params.back(), 1), initial_values(m.blocks[0].params[0], 1));
  EXPECT_NE(initial_values(m.blocks[1].params[2], 1), initial_values(m.blocks[2].params[2], 1));
  EXPECT_NE(initial_values(blk[2], 1), initial_values(blk[2], 2));
}

// A dense Llama layer keeps two (rows, ffn_hidden) values of a micro-batch from its forward, gate's and up's: the
// SwiGLU output is a backward buffer (scratch the forward's down projection reads and backward_weight recomputes),
// so schedules that run B and W together share one for every block and slot.
TEST(LlamaSpec, SwigluOutputIsBackwardScratch) {
  Config c;
  c.model.type = "llama";
  c.model.vocab_size = 64;
  c.model.block_size = 16;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 8;
  c.model.edit_args<LlamaArgs>().n_kv_head = 1;
  c.model.edit_args<LlamaArgs>().ffn_hidden = 24;
  const ModelSpec m = make_model_spec(c, 0);
  const BlockSpec& layer = m.blocks.at(1);
  ASSERT_EQ(layer.kind, BlockKind::llama_layer);
  int kept = 0, scratch = 0;
  for (const BufferSpec& b : saved_shapes(layer, 32, 1))
    if (b.shape == Shape{32, 24}) (b.backward ? scratch : kept) += 1;
  EXPECT_EQ(kept, 2);     // gate, up
  EXPECT_EQ(scratch, 3);  // h, d gate, d up
}

namespace {

// DeepSeek-V3's generation (model/mla_blocks.cpp's decode: the compressed cache of latents and rotary keys, queries
// absorbed through W_UK, outputs through W_UV) against its training forward (keys and values materialised per head):
// the logits of every position of a greedy continuation equal the forward's over the same tokens (fp32). The small
// config (layer 0 dense, layer 1 routed: sigmoid router, group-limited top-k, a shared expert, routed scaling) with
// weights 10x the config's init_std so that attention is far from uniform, and a non-zero expert bias.
void expect_decode_matches_forward(const std::vector<std::string>& overrides, const char* what) {
  std::vector<std::string> o = {"model.block_size=12", "model.init_std=0.2", "train.precision=\"fp32\""};
  o.insert(o.end(), overrides.begin(), overrides.end());
  const Config cfg = load_config(test::source_dir() + "/configs/deepseek-v3-small-bytes.toml", o);
  const int64_t T = cfg.model.block_size, V = cfg.model.vocab_size;
  auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
  ParamStore store(*be, cfg.model.seed);
  const ModelSpec spec = make_model_spec(cfg, 0);
  std::vector<float> bias;
  for (int64_t e = 0; e < 8; ++e) bias.push_back(0.05f * float(e % 3) - 0.04f);  // (MoE layers = 1, 8 experts)
  Generator gen(*be, cfg, store);
  gen.set_expert_bias(bias);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = T - 1;
  std::vector<std::vector<float>> decoded;                       // (T - 1, V): position i's logits
  const std::vector<int32_t> seq = gen.generate({17}, greedy, &decoded);  // T tokens
  ASSERT_EQ(seq.size(), size_t(T));
  ASSERT_EQ(gen.cached_positions(), T - 1);
  // The training forward over the same T tokens, one sequence, the same parameters.
  Tensor x(*be, {T}, DType::i32);
  be->upload(x, seq.data());
  std::vector<BlockSaved> saved(spec.blocks.size());
  Tensor in = x;
  for (size_t k = 0; k < spec.blocks.size(); ++k) {
    auto block = make_block(spec.blocks[k], store);
    block->set_expert_bias(*be, bias);
    block->allocate_saved(*be, T, saved[k]);
    Tensor out(*be, {T, block->out_width()});
    block->forward(*be, in, out, saved[k]);
    in = out;
  }
  std::vector<float> full(size_t(T * V));
  be->download(full.data(), in);                                // (T, V)
  double worst = 0, scale = 0;
  for (int64_t t = 0; t + 1 < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double want = full[size_t(t * V + v)];
      worst = std::max(worst, std::abs(double(decoded[size_t(t)][size_t(v)]) - want));
      scale = std::max(scale, std::abs(want));
    }
  EXPECT_GT(scale, 0.5) << what << ": logits too small to tell the forms apart";
  EXPECT_LE(worst, 1e-5 * scale) << what << ": decode's logits differ from the forward's by " << worst << " (scale "
                                 << scale << ")";
}

}  // namespace

TEST(MlaDecode, LogitsEqualTheForwardsQLoraInterleaved) {
  expect_decode_matches_forward({}, "q_lora_rank 48, interleaved rotary pairs");
}
TEST(MlaDecode, LogitsEqualTheForwardsQProjYarnRotateHalf) {
  expect_decode_matches_forward({"model.q_lora_rank=0", "model.rope_interleave=false", "model.rope_scaling=\"yarn\"",
                                 "model.rope_factor=4.0", "model.rope_original_max_position_embeddings=4",
                                 "model.rope_mscale=1.0", "model.rope_mscale_all_dim=0.8"},
                                "q_proj, rotate-half pairs, YaRN x4 over 4 original positions");
}
