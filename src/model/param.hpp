// Parameters: what a parameter is (name, torch shape, initialisation) and the per-rank store that owns
// them. Blocks hold handles; a weight used by two blocks of one rank (tied embeddings on pp = 1) is one
// Param, and on two stages a pair of Params with one name that the trainer keeps equal.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "model/tensor_parallel.hpp"

namespace relay {

// Initial values as a pure function of (model.seed, the spec): the same on every rank and layout.
struct ParamInit {
  enum Kind { uniform, normal, constant } kind = constant;
  double a = 0;         // uniform: U(-a, a); normal: N(0, a); constant: a
  uint64_t stream = 0;  // Rng stream (MLP: layer index; GPT: a hash of the parameter name)
  uint64_t skip = 0;    // draws to skip first (an MLP bias continues its weight's stream, as before)
};

inline ParamInit param_constant(double v) { return {ParamInit::constant, v, 0, 0}; }

struct ParamSpec {
  std::string name;  // torch state_dict name: "3.weight", "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // torch shape (the whole tensor)
  ParamInit init;
  TpSplit split{};   // how tensor parallelism splits it (inert when parallel.tp = 1)
  // A linear weight its block's GEMMs take whole (model/fp8_linear.hpp's Fp8Weight): under train.precision = "fp8"
  // ZeRO-3 keeps it in buckets of its own, which parallel.fp8_param_gather gathers as e4m3 codes (make_block sets
  // Param::fp8_weight from it; the memory plan counts those buckets from it).
  bool fp8_gemm = false;
  // A mixture of experts' weight (a routed or shared expert's gate, up or down) of FP8 GEMMs taken whole: its codes
  // are cached as fp8_gemm's are (Fp8WeightCache), but ZeRO-3 keeps it in the experts' (or the dense) units as before.
  bool fp8_expert = false;
  // Its FP8 codes are cached (Param::fp8_cache) under train.precision = "fp8": the memory plan counts them.
  bool fp8_cached() const { return fp8_gemm || fp8_expert; }
};
// s marked as a linear weight of FP8 GEMMs (ParamSpec::fp8_gemm).
inline ParamSpec fp8_gemm(ParamSpec s) {
  s.fp8_gemm = true;
  return s;
}
// s marked as an expert's weight of FP8 grouped GEMMs (ParamSpec::fp8_expert).
inline ParamSpec fp8_expert(ParamSpec s) {
  s.fp8_expert = true;
  return s;
}

// train.precision = "fp8": a linear weight's FP8 codes and scales as Fp8Linear made them from the working copy, kept
// and reused by every GEMM that reads the weight (the forward's W^T and the input gradient's W take the same codes:
// e4m3, one tensorwise scale or 128 x 128 blocks) until the working copy changes: quantised once per optimizer step,
// not once per micro-batch and use (torchao's Float8 and Transformer Engine cache the weight's cast across gradient
// accumulation the same way). The cache holds the Param's version it was made from (Param::version): whoever writes the
// working copy bumps the version (Param::weights_changed), and a cache of another version is made again. The memory
// plan counts the codes and scales as parameter bytes (train/memory_plan.cpp).
struct Fp8WeightCache {
  Tensor q;            // (out, in) e4m3 codes of this rank's shard
  Tensor scales;       // fp8_grid(tiling, out, in) f32: (1, 1) tensorwise, (ceil(out / 128), ceil(in / 128)) blockwise
  uint64_t version = 0;  // the Param::version q and scales were made from (0: never made; versions start at 1)
  const void* made_from = nullptr;  // the working copy's storage they were made from (a re-pointed copy is caught)
  // ZeRO-3 gathers the weight for its uses and frees it after; keeping its codes would keep a whole copy of every
  // weight, which ZeRO-3 is there to avoid: no cache (under parallel.fp8_param_gather the gathered codes are the cache).
  // Set on every parameter under ZeRO-3 (an expert's unit with no other copy included), as the memory plan counts.
  bool off = false;
};

struct Param {
  std::string name;
  Tensor value;  // fp32 master, this rank's shard of the torch shape (the whole of it when not split)
  Tensor grad;   // fp32, same shape; storage owned by the gradient buckets (data_parallel)
  Shape full_shape;  // the torch shape
  TpSplit split{};
  Tensor work;   // bf16 runs: the working copy forward and backward read (written by the optimizer)
  Shape shape;   // this rank's shard shape: value's, also while ZeRO-3 holds no whole value
  // ZeRO-3 (ParamStore made with defer): the shard's initial values on the host, computed when GradBuckets takes this
  // rank's piece of them; value and work are never allocated whole at setup. Empty otherwise.
  std::function<std::vector<float>()> initial;
  DType work_dtype = DType::f32;  // the working copy's dtype (bf16 under mixed precision), allocated or not
  // A linear layer's weight that its block hands to Fp8Linear whole (as a Param) in every GEMM, under
  // train.precision = "fp8": ZeRO-3 gives these units of their own, which parallel.fp8_param_gather gathers as e4m3
  // codes. While gathered so, work holds the codes (out, in) and fp8_scale (1, 1) f32 their tensorwise scale.
  bool fp8_weight = false;
  bool fp8_cached = false;  // ParamSpec::fp8_cached() under FP8: its GEMMs take the Param and cache its codes
  Tensor fp8_scale = Tensor();
  // fp8_cached's codes and scales, made by the first FP8 GEMM that reads this version of the working
  // copy (mutable: the GEMMs see the parameter as const; the cache changes nothing the parameter means).
  mutable Fp8WeightCache fp8_cache = Fp8WeightCache();
  // The working copy's version: every write of value or work bumps it (weights_changed), the one thing a cache of the
  // working copy compares. The writers: the optimizer step and ZeRO-1/2's settle (GradBuckets), ZeRO-3's gather and
  // release (GradBuckets), and every write from outside the optimizer through refresh_work (initialisation,
  // checkpoint load, import). A writer that forgets is caught where it can be: a working copy re-pointed without a
  // bump fails the cache's check of its storage (model/fp8_linear.cpp), and RELAY_CHECK_FP8_CACHE=1 in the environment
  // compares every cached use with the codes quantised afresh (the FP8 layout tests set it).
  uint64_t version = 1;
  // The working copy (or the value it follows) was written: the next FP8 GEMM quantises the weight again.
  void weights_changed() { ++version; }
  bool sharded() const { return shape_numel(shape) != shape_numel(full_shape); }
  // What the model computes with: the bf16 working copy, or the fp32 value itself.
  const Tensor& compute() const { return work.defined() ? work : value; }
  // After value was written from outside the optimizer (initialisation, checkpoint, import).
  void refresh_work(Backend& be) {
    if (work.defined()) be.convert(value, work);
    weights_changed();
  }
  // value (and the working copy) allocated whole and set from `initial`, which is then dropped: ParamStore's
  // parameters, and under ZeRO-3 the deferred ones no other rank shares (an expert with no other copy).
  void materialize(Backend& be);
};

// 64-bit FNV-1a of a parameter name: the GPT initialisation stream.
uint64_t name_stream(const std::string& name);
// The spec's initial values (numel floats).
std::vector<float> initial_values(const ParamSpec& spec, uint64_t model_seed);

class ParamStore {
 public:
  // tp, tp_rank: this rank's place in its tensor-parallel group; a split parameter holds its shard.
  // work_dtype bf16: every Param gets a bf16 working copy (mixed precision).
  // defer (ZeRO-3): nothing is allocated; each Param's `initial` gives its values when they are sharded.
  ParamStore(Backend& be, uint64_t model_seed, int tp = 1, int tp_rank = 0, DType work_dtype = DType::f32,
             bool defer = false)
      : be_(be), seed_(model_seed), tp_(tp), tp_rank_(tp_rank), work_dtype_(work_dtype), defer_(defer) {}
  // This rank's Param for the spec: created and initialised (the whole tensor's initial values, then
  // this rank's shard: every layout starts from the same weights) on the first request; later requests
  // with the same name return the same Param (shapes must agree).
  Param* get(const ParamSpec& spec);
  Param* find(const std::string& name);   // null when this rank holds no such parameter
  std::vector<Param*> all();              // in creation order

 private:
  Backend& be_;
  uint64_t seed_;
  int tp_, tp_rank_;
  DType work_dtype_;
  bool defer_;
  std::deque<Param> params_;  // stable addresses
  std::map<std::string, Param*> by_name_;
};

}  // namespace relay
