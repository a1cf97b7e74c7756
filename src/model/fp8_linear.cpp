// A linear layer's GEMMs in FP8 (model/fp8_linear.hpp): quantise each operand for its GEMM, then Backend::fp8_matmul.
// Recipes after torchao's Float8 (tensorwise, dynamic scaling) and DeepSeek-V3 (arXiv:2412.19437, 1 x 128 / 128 x 128).
#include "model/fp8_linear.hpp"

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "model/block.hpp"
#include "model/param.hpp"

namespace relay {

namespace {

// An operand's role in its GEMM: it decides the format (tensorwise) and, with the GEMM, the tiling (blockwise).
enum class Role { activation, weight, output_grad };

// One quantised operand: codes (rows, cols) and its tiles' scales (fp8_grid's shape), f32.
struct Quantised {
  Tensor q, scales;
  Fp8Tiling tiling;
};

// The tiling and format of an operand in its role (k_along_rows: the GEMM reduces over its rows). A weight's do not
// depend on the GEMM: one tensorwise scale, or 128 x 128 blocks, e4m3 in both recipes.
Fp8Tiling tiling_of(Fp8Recipe recipe, Role role, bool k_along_rows) {
  if (recipe == Fp8Recipe::tensorwise || role == Role::weight) return fp8_weight_tiling(recipe);
  return k_along_rows ? Fp8Tiling::col_128x1 : Fp8Tiling::row_1x128;
}
DType format_of(Fp8Recipe recipe, Role role) {
  // gradients need e5m2's range more than e4m3's precision (tensorwise; blockwise's 1 x 128 tiles take e4m3)
  return recipe == Fp8Recipe::tensorwise && role == Role::output_grad ? DType::fp8_e5m2 : DType::fp8_e4m3;
}

// q (rows, cols) and scales (fp8_grid) of x with the tiling. tp: the ranks holding shards of x (null: none); a
// tensorwise scale comes from the largest of their amaxes, so it is the whole tensor's (an all-zero or non-finite
// shard included), and x is quantised with it.
void quantise_into(Backend& be, const Tensor& x, Fp8Tiling tiling, Communicator* tp, Tensor& q, Tensor& scales) {
  if (!tp || tiling != Fp8Tiling::tensor) return be.fp8_quantize(x, tiling, q, scales);
  // A shard: its amax (one read of x), the max over the group (exact: integer bits), then the codes (a second read).
  Tensor amax(be, {1, 1}, DType::i32);  // (1, 1) |x|'s max as float bits
  be.fp8_amax(x, tiling, amax);
  RequestPtr req = tp->iallreduce(amax, ReduceOp::max);
  req->what = "the FP8 tensorwise amax all-reduce (max over the tensor-parallel group)";
  req->wait();
  be.fp8_quantize_amax(x, tiling, amax, q, scales);
}

Quantised quantise(Backend& be, const Tensor& x, Fp8Recipe recipe, Role role, bool k_along_rows, Communicator* tp) {
  const Fp8Tiling tiling = tiling_of(recipe, role, k_along_rows);
  const Fp8Grid g = fp8_grid(tiling, x.size(0), x.size(1));
  Quantised out{Tensor(be, {x.size(0), x.size(1)}, format_of(recipe, role)), Tensor(be, {g.rows, g.cols}), tiling};
  quantise_into(be, x, tiling, tp, out.q, out.scales);  // (rows, cols), grid
  return out;
}

// RELAY_CHECK_FP8_CACHE=1: every cached weight's use quantises it afresh and compares (model/param.hpp's version).
bool check_cache() {
  static const bool on = [] {
    const char* v = std::getenv("RELAY_CHECK_FP8_CACHE");
    return v && std::string(v) == "1";
  }();
  return on;
}
std::vector<uint8_t> host_bytes(Backend& be, const Tensor& t) {
  std::vector<uint8_t> out(size_t(t.bytes()));
  be.download(out.data(), t);
  return out;
}

// A Param's weight through its cache: quantised when the working copy changed since, else as it was. The buffers are
// the parameter's (MemKind::params, planned with it), allocated once and rewritten in place.
Quantised cached_weight(Backend& be, const Tensor& w, const Param& p, Fp8Recipe recipe, Communicator* tp) {
  Fp8WeightCache& c = p.fp8_cache;
  const Fp8Tiling tiling = tiling_of(recipe, Role::weight, false);
  if (!c.q.defined()) {
    MemoryScope as_params(MemKind::params);
    const Fp8Grid g = fp8_grid(tiling, w.size(0), w.size(1));
    c.q = Tensor(be, {w.size(0), w.size(1)}, format_of(recipe, Role::weight));  // (out, in)
    c.scales = Tensor(be, {g.rows, g.cols});                                    // grid
  }
  RELAY_ASSERT(c.q.size(0) == w.size(0) && c.q.size(1) == w.size(1), "Fp8Linear: a cached weight changed its shape");
  if (c.version != p.version) {
    quantise_into(be, w, tiling, tp, c.q, c.scales);
    c.version = p.version;
    c.made_from = w.raw();
    return {c.q, c.scales, tiling};
  }
  // A hit: the working copy must be the one the codes came from. One that moved without a version bump is a writer
  // that forgot Param::weights_changed (model/param.hpp).
  RELAY_ASSERT(w.raw() == c.made_from, "Fp8Linear: parameter " << p.name << "'s working copy moved without a version "
               "bump (version " << p.version << "): its cached FP8 codes are stale; whoever re-points it must call "
               "Param::weights_changed");
  if (check_cache()) {  // the same codes quantised afresh, compared byte for byte
    Quantised fresh = quantise(be, w, recipe, Role::weight, false, tp);
    RELAY_ASSERT(host_bytes(be, fresh.q) == host_bytes(be, c.q) &&
                     host_bytes(be, fresh.scales) == host_bytes(be, c.scales),
                 "Fp8Linear: parameter " << p.name << "'s working copy changed without a version bump (version "
                 << p.version << "): its cached FP8 codes are stale; whoever writes it must call "
                 "Param::weights_changed (caught by RELAY_CHECK_FP8_CACHE)");
  }
  return {c.q, c.scales, tiling};
}

Activation activation_of(LinearAct act) {
  RELAY_ASSERT(act == LinearAct::gelu_tanh, "Fp8Linear: no activation for LinearAct " << int(act));
  return Activation::gelu_tanh;
}

}  // namespace

Fp8Weight::Fp8Weight(const Param& p)
    : w(p.compute()), scale(p.fp8_scale.defined() ? &p.fp8_scale : nullptr),
      cached(p.fp8_cached && !p.fp8_cache.off ? &p : nullptr) {}

void Fp8Linear::linear(Backend& be, const Tensor& x, const Fp8Weight& w, const Tensor& bias, Tensor& y, LinearAct act,
                       Tensor* pre_act) const {
  if (!on()) return be.linear(x, w.w, bias, y, act, pre_act);
  Tensor scratch;
  if (act != LinearAct::none && !pre_act)  // inference keeps no pre_act
    scratch = Tensor(be, {y.size(0), y.size(1)}, y.dtype());  // (n, out)
  Tensor& z = act == LinearAct::none ? y : pre_act ? *pre_act : scratch;  // (n, out): the GEMM's output plus the bias
  if (bias.defined() && z.dtype() != DType::f32) {
    // As Backend::linear's epilogue: the bias added to the GEMM's fp32 sums, rounded to z's dtype once (rounding the
    // GEMM's output first and again after the bias would be arithmetic the bf16 run does not do).
    Tensor acc(be, {z.size(0), z.size(1)});  // (n, out) f32
    Tensor bias32(be, {bias.numel()});        // (out) f32
    matmul(be, x, w, true, acc);
    be.convert(bias, bias32);
    be.add_bias(acc, bias32);
    be.convert(acc, z);
  } else {
    matmul(be, x, w, true, z);
    if (bias.defined()) be.add_bias(z, bias);
  }
  if (act != LinearAct::none) be.activation_forward(activation_of(act), z, y);
}

void Fp8Linear::linear_backward_input(Backend& be, const Tensor& dy, const Fp8Weight& w, Tensor& dx, LinearAct act,
                                      const Tensor& act_in) const {
  if (!on()) return be.linear_backward_input(dy, w.w, dx, act, act_in);
  matmul(be, dy, w, false, dx);  // (n, in)
  if (act != LinearAct::none) be.activation_backward(activation_of(act), act_in, dx, dx);
}

void Fp8Linear::matmul(Backend& be, const Tensor& x, const Fp8Weight& w, bool trans_w, Tensor& y, float beta) const {
  RELAY_ASSERT(!w.scale || (on() && *recipe_ == Fp8Recipe::tensorwise),
               "Fp8Linear: a weight gathered as FP8 codes needs the tensorwise FP8 recipe");
  if (!on()) return be.matmul(x, false, w.w, trans_w, y, 1.f, beta);
  // x's K runs along its columns in both uses; W's along its columns in the forward (W^T), its rows otherwise.
  const Quantised a = quantise(be, x, *recipe_, trans_w ? Role::activation : Role::output_grad, false, tp_);
  if (w.scale)  // gathered as codes (parallel.fp8_param_gather): what quantise would make of the working copy
    return be.fp8_matmul(a.q, a.scales, a.tiling, false, w.w, *w.scale, Fp8Tiling::tensor, trans_w, y, beta);
  const Quantised b = w.cached ? cached_weight(be, w.w, *w.cached, *recipe_, tp_)
                              : quantise(be, w.w, *recipe_, Role::weight, !trans_w, tp_);
  be.fp8_matmul(a.q, a.scales, a.tiling, false, b.q, b.scales, b.tiling, trans_w, y, beta);
}

void Fp8Linear::weight_grad(Backend& be, const Tensor& dy, const Tensor& x, Tensor& dw) const {
  if (!on()) return be.matmul(dy, true, x, false, dw, 1.f, 1.f);
  // K is the rows (tokens) of both: 128 x 1 tiles blockwise.
  const Quantised a = quantise(be, dy, *recipe_, Role::output_grad, true, tp_);
  const Quantised b = quantise(be, x, *recipe_, Role::activation, true, tp_);
  be.fp8_matmul(a.q, a.scales, a.tiling, true, b.q, b.scales, b.tiling, false, dw, 1.f);
}

void Fp8Linear::grouped_matmul(Backend& be, const Tensor& a, const std::vector<Param*>& b, bool trans_b, Tensor& y,
                               const std::vector<int64_t>& offsets, float beta) const {
  if (!on()) {
    std::vector<Tensor> w;  // each expert's working copy (out, in)
    for (const Param* p : b) w.push_back(p->compute());
    return be.grouped_matmul(a, w, trans_b, y, offsets, beta);
  }
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t m = offsets[g + 1] - offsets[g];
    if (m == 0) continue;
    Tensor yg = y.rows(offsets[g], m);
    matmul(be, a.rows(offsets[g], m), Fp8Weight(*b[g]), trans_b, yg, beta);  // (m_g, n), b[g]'s codes cached
  }
}

void Fp8Linear::grouped_weight_grad(Backend& be, const Tensor& dy, const Tensor& x, const std::vector<int64_t>& offsets,
                                    const std::vector<Tensor>& dw) const {
  if (!on()) return be.grouped_matmul_weight(dy, x, offsets, dw, 1.f);
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t m = offsets[g + 1] - offsets[g];
    if (m == 0) continue;  // beta 1: an expert without rows keeps its gradient
    Tensor dwg = dw[g];
    weight_grad(be, dy.rows(offsets[g], m), x.rows(offsets[g], m), dwg);  // (n, k) += (m_g, n)^T (m_g, k)
  }
}

Fp8Linear fp8_linear(const BlockSpec& spec, Communicator* tp) { return Fp8Linear(spec.fp8, tp); }

void check_fp8_widths(const std::vector<BlockSpec>& blocks) {
  for (const BlockSpec& b : blocks) {
    if (!b.fp8) continue;
    auto check = [&](int64_t w, const std::string& what) {
      if (w % 16 == 0) return;
      throw Error(cat("train.precision = \"fp8\": the ", what, " of block ", b.index, " (", block_kind_name(b.kind),
                      ") is ", w, ", not a multiple of 16 (FP8 GEMMs need every linear layer's widths to be multiples "
                      "of 16; hint: choose such widths, or train this model in \"bf16\")"));
    };
    switch (b.kind) {
      case BlockKind::transformer:
        check(b.in, "model width (model.n_embd)");  // qkv 3C and the MLP's 4C follow
        break;
      case BlockKind::llama_layer:
        check(b.in, "model width (model.n_embd)");
        check(b.n_head * head_dim(b), "query width (n_head x head size)");
        check(b.n_kv_head * head_dim(b), "key/value width (n_kv_head x head size)");
        if (!b.moe.on()) check(b.ffn_hidden, "SwiGLU width (model.ffn_hidden)");
        else check(b.moe.ffn_hidden, "expert SwiGLU width (model.moe_ffn_hidden)");
        break;
      case BlockKind::mla_layer: {
        const MlaSpec& m = b.mla;
        check(b.in, "model width (model.n_embd)");
        if (m.q_lora_rank > 0) check(m.q_lora_rank, "query latent width (model.q_lora_rank)");
        check(b.n_head * m.qk_head(), "query width (n_head x (qk_nope_head_dim + qk_rope_head_dim))");
        check(m.kv_lora_rank, "key/value latent width (model.kv_lora_rank)");
        check(m.qk_rope, "rotary key width (model.qk_rope_head_dim)");
        check(b.n_head * (m.qk_nope + m.v_head), "kv_b_proj's width (n_head x (qk_nope_head_dim + v_head_dim))");
        check(b.n_head * m.v_head, "value width (n_head x v_head_dim)");
        if (!b.moe.on()) check(b.ffn_hidden, "SwiGLU width (model.ffn_hidden)");
        else check(b.moe.ffn_hidden, "expert SwiGLU width (model.moe_ffn_hidden)");
        break;
      }
      default:  // the MLP's linear blocks, one per config layer
        check(b.in, b.index == 0 ? "input width (the data's features)"
                                 : cat("input width (model.layers[", b.index - 1, "]'s output)"));
        check(b.out, cat("output width (model.layers[", b.index, "].out)"));
        break;
    }
  }
}

}  // namespace relay
