// The registry of block kinds: the model's blocks from its family (src/model/families) and the factory that
// builds each kind, plus what every family's blocks share (the language models' embedding and head).
#include "model/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "model/blocks.hpp"
#include "model/family.hpp"

namespace relay {

const char* block_kind_name(BlockKind k) {
  switch (k) {
    case BlockKind::linear: return "linear";
    case BlockKind::relu: return "relu";
    case BlockKind::gelu: return "gelu";
    case BlockKind::tanh: return "tanh";
    case BlockKind::layernorm: return "layernorm";
    case BlockKind::embedding: return "embedding";
    case BlockKind::transformer: return "transformer";
    case BlockKind::llama_layer: return "llama_layer";
    case BlockKind::mla_layer: return "mla_layer";
    case BlockKind::mtp: return "mtp";
    case BlockKind::head: return "head";
  }
  return "?";
}

BlockSpec lm_embedding(std::vector<ParamSpec> params, int64_t C, int64_t T) {
  BlockSpec b;
  b.kind = BlockKind::embedding;
  b.in = 0;
  b.out = C;
  b.seq_len = T;
  b.params = std::move(params);
  b.flops = double(C);
  return b;
}
BlockSpec lm_head(std::vector<ParamSpec> params, int64_t C, int64_t V, int64_t T, bool bias, NormKind norm, double eps) {
  BlockSpec b;
  b.kind = BlockKind::head;
  b.in = C;
  b.out = V;
  b.seq_len = T;
  b.bias = bias;
  b.norm = norm;
  b.eps = eps;
  b.params = std::move(params);
  b.flops = 2.0 * double(C) * double(V);
  return b;
}

std::vector<std::string> ModelSpec::tied() const {
  std::map<std::string, int> uses;
  std::vector<std::string> out;
  for (const BlockSpec& b : blocks)
    for (const ParamSpec& p : b.params)
      if (++uses[p.name] == 2) out.push_back(p.name);
  return out;
}

std::string ModelSpec::tp_shard(int tp, int r) const {
  if (tp == 1 || !language_model) return "whole blocks";
  auto range = [&](const char* what, int64_t n) {
    return cat(what, " [", tp_begin(n, tp, r), ", ", tp_end(n, tp, r), ") of ", n);
  };
  for (const BlockSpec& b : blocks) {
    if (b.kind == BlockKind::transformer)
      return cat(range("heads", b.n_head), ", ", range("MLP units", 4 * b.in), ", ", range("vocabulary", output_dim));
    if (b.kind == BlockKind::mla_layer)
      return cat(range("heads", b.n_head), ", ", range("SwiGLU units", b.ffn_hidden), ", ", range("vocabulary", output_dim));
    if (b.kind == BlockKind::llama_layer)
      return cat(range("query heads", b.n_head), ", ", range("key/value heads", b.n_kv_head), ", ",
                 range("SwiGLU units", b.ffn_hidden), ", ", range("vocabulary", output_dim));
  }
  return range("vocabulary", output_dim);
}

ModelSpec make_model_spec(const Config& cfg, int64_t input_dim) {
  ModelSpec m = model_family(cfg).blocks(cfg, input_dim);
  for (size_t i = 0; i < m.blocks.size(); ++i) m.blocks[i].index = static_cast<int>(i);
  for (BlockSpec& b : m.blocks) {
    b.dtype = compute_dtype(cfg.train.precision);
    for (BlockSpec& inner : b.inner) inner.dtype = b.dtype, inner.index = b.index;
  }
  if (cfg.train.precision == Precision::fp8) {
    for (BlockSpec& b : m.blocks)
      if (b.kind == BlockKind::transformer || b.kind == BlockKind::llama_layer || b.kind == BlockKind::mla_layer ||
          b.kind == BlockKind::linear)
        b.fp8 = cfg.train.fp8_recipe;
  }
  if (cfg.parallel.sequence_parallel && m.language_model && cfg.parallel.tp > 1)
    for (BlockSpec& b : m.blocks) b.sp = static_cast<int>(cfg.parallel.tp);
  return m;
}

void allocate_buffers(Backend& be, const std::vector<BufferSpec>& specs, std::vector<Tensor>& out) {
  BlockSaved own;  // no shared buffers: every buffer its own
  allocate_buffers(be, specs, own);
  out = std::move(own.t);
}

void allocate_buffers(Backend& be, const std::vector<BufferSpec>& specs, BlockSaved& saved) {
  saved.t.clear();
  for (size_t i = 0; i < specs.size(); ++i)
    if (saved.shared && specs[i].backward) saved.t.push_back(saved.shared->get(be, i, specs[i]));
    else saved.t.emplace_back(be, specs[i].shape, specs[i].dtype);
}

Tensor SharedBuffers::get(Backend& be, size_t index, const BufferSpec& spec) {
  Tensor& t = t_[key(index, spec)];
  if (!t.defined()) t = Tensor(be, spec.shape, spec.dtype);
  return t;
}

int64_t SharedBuffers::planned_bytes(const std::vector<std::vector<BufferSpec>>& lists) {
  std::set<Key> seen;
  int64_t bytes = 0;
  for (const auto& specs : lists)
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].backward && seen.insert(key(i, specs[i])).second) bytes += specs[i].bytes();
  return bytes;
}

std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t rows, int tp) {
  switch (spec.kind) {
    case BlockKind::embedding:
    case BlockKind::transformer:
    case BlockKind::head: return gpt_saved_shapes(spec, rows, tp);
    case BlockKind::llama_layer: return llama_saved_shapes(spec, rows, tp);
    case BlockKind::mla_layer: return mla_saved_shapes(spec, rows, tp);
    case BlockKind::mtp: return mtp_saved_shapes(spec, rows, tp);
    default: return mlp_saved_shapes(spec, rows);
  }
}

int64_t saved_bytes(const BlockSpec& spec, int64_t rows, int tp) {
  int64_t n = 0;
  for (const BufferSpec& b : saved_shapes(spec, rows, tp)) n += b.bytes();
  return n;
}

int64_t block_out_width(const BlockSpec& spec, int tp, int tp_rank) {
  if (spec.kind != BlockKind::head) return spec.out;
  return tp_end(spec.out, tp, tp_rank) - tp_begin(spec.out, tp, tp_rank);
}

std::unique_ptr<Block> make_block(const BlockSpec& spec, ParamStore& store, const TensorParallel& tp,
                                  const ContextParallel& cp, const ExpertParallel& ep) {
  std::vector<Param*> params;
  for (size_t i = 0; i < spec.params.size(); ++i)
    if (ep.holds(spec, i)) {
      params.push_back(store.get(spec.params[i]));
      // Its GEMMs take the Param (Fp8Weight): ZeRO-3 keeps it apart and may gather it as FP8 codes.
      if (spec.fp8 && spec.params[i].fp8_gemm) params.back()->fp8_weight = true;
      // A linear's or an expert's weight: its codes cached (an expert's ZeRO-3 units the experts' as ever).
      if (spec.fp8 && spec.params[i].fp8_cached()) params.back()->fp8_cached = true;
    }
  switch (spec.kind) {
    case BlockKind::embedding:
    case BlockKind::transformer:
    case BlockKind::head: return make_gpt_block(spec, std::move(params), tp, cp);
    case BlockKind::llama_layer: return make_llama_block(spec, std::move(params), tp, cp, ep);
    case BlockKind::mla_layer: return make_mla_block(spec, std::move(params), tp, cp, ep);
    case BlockKind::mtp: return make_mtp_block(spec, std::move(params), tp, cp, ep);
    default: return make_mlp_block(spec, std::move(params));
  }
}

}  // namespace relay
