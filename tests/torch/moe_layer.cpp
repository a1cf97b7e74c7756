// Relay's MoE layer (model/moe.hpp: MoeMlp, on the CPU backend in fp32) forward and backward on weights and inputs
// from a file, for tests/torch/test_deepseek_moe_reference.py, which compares it with transformers' DeepseekV3MoE.
//   moe_layer <in.bin> <out.bin>
// in.bin, little-endian: 12 int64 (n, T, C, E, k, F, n_group, topk_group, renormalize, n_shared, sigmoid, has_bias),
// 2 float64 (routed_scaling, aux_weight), then float32 arrays: x (n, C), dy (n, C), the router (E, C), the bias (E)
// when has_bias, the shared experts' gate (Fs, C), up (Fs, C), down (C, Fs) when n_shared (Fs = n_shared F), every
// expert's gate (F, C), up (F, C), down (C, F).
// out.bin: float32 y (n, C), dx (n, C), every parameter's gradient in the order above (the bias has none), then
// int32 experts (n, k), then float64 aux (the sum over sequences of each one's load-balancing aux).
#include <cstdio>
#include <deque>
#include <vector>

#include "backend/backend.hpp"
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

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: moe_layer <in.bin> <out.bin>\n");
    return 2;
  }
  try {
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

    auto be = make_backend(BackendOptions{Device::cpu, 1, 0, Precision::fp32});
    auto upload = [&](Shape s, const std::vector<float>& v) {
      Tensor t(*be, std::move(s));
      be->upload_f32(t, v.data());
      return t;
    };
    const auto x = take<float>(in, size_t(n * C), "x"), dy = take<float>(in, size_t(n * C), "dy");
    std::deque<Param> params;  // stable addresses
    auto param = [&](Shape s, const char* what) {
      Param& p = params.emplace_back();
      p.value = upload(s, take<float>(in, size_t(shape_numel(s)), what));
      p.grad = Tensor(*be, s);
      be->fill(p.grad, 0.f);
      p.shape = p.full_shape = s;
    };
    param({E, C}, "the router");
    std::vector<float> bias;
    if (spec.moe.expert_bias) bias = take<float>(in, size_t(E), "the bias");
    const int64_t Fs = spec.moe.shared_hidden();
    if (Fs > 0) {
      param({Fs, C}, "the shared gate");
      param({Fs, C}, "the shared up");
      param({C, Fs}, "the shared down");
    }
    for (int64_t e = 0; e < E; ++e) {
      param({F, C}, "an expert's gate");
      param({F, C}, "an expert's up");
      param({C, F}, "an expert's down");
    }
    std::fclose(in);

    std::vector<Param*> ptrs;
    for (Param& p : params) ptrs.push_back(&p);
    MoeMlp moe(spec, ptrs);
    if (!bias.empty()) moe.set_bias(*be, bias.data());
    std::vector<Tensor> saved;
    allocate_buffers(*be, MoeMlp::saved_shapes(spec, n), saved);
    Tensor tx = upload({n, C}, x), tdy = upload({n, C}, dy), y(*be, {n, C}), dx(*be, {n, C});
    moe.forward(*be, tx, y, saved.data());
    moe.backward_input(*be, tdy, dx, saved.data());
    moe.backward_weight(*be, tx, saved.data());
    std::vector<RouterStats> stats;
    moe.take_stats(stats);

    std::FILE* out = std::fopen(argv[2], "wb");
    if (!out) throw Error(cat("moe_layer: cannot write ", argv[2]));
    auto get = [&](const Tensor& t) {
      std::vector<float> v(size_t(t.numel()));  // (numel)
      be->download(v.data(), t);
      return v;
    };
    put(out, get(y));
    put(out, get(dx));
    for (Param& p : params) put(out, get(p.grad));
    std::vector<int32_t> experts(size_t(n * k));  // (n, k) the saved routing: the layer's first buffers
    be->download(experts.data(), saved[3]);
    put(out, experts);
    put(out, std::vector<double>{stats.at(0).aux_sum});
    std::fclose(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
