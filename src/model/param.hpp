// Parameters: what a parameter is (name, torch shape, initialisation) and the per-rank store that owns
// them. Blocks hold handles; a weight used by two blocks of one rank (tied embeddings on pp = 1) is one
// Param, and on two stages a pair of Params with one name that the trainer keeps equal.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace relay {

// Initial values as a pure function of (model.seed, the spec): the same on every rank and layout.
struct ParamInit {
  enum Kind { uniform, normal, constant } kind = constant;
  double a = 0;         // uniform: U(-a, a); normal: N(0, a); constant: a
  uint64_t stream = 0;  // Rng stream (MLP: layer index; GPT: a hash of the parameter name)
  uint64_t skip = 0;    // draws to skip first (an MLP bias continues its weight's stream, as before)
};

struct ParamSpec {
  std::string name;  // torch state_dict name: "3.weight", "transformer.h.0.attn.c_attn.weight"
  Shape shape;       // torch shape
  ParamInit init;
};

struct Param {
  std::string name;
  Tensor value;  // fp32, the torch shape
  Tensor grad;   // same shape; storage owned by the gradient buckets (data_parallel)
};

// 64-bit FNV-1a of a parameter name: the GPT initialisation stream.
uint64_t name_stream(const std::string& name);
// The spec's initial values (numel floats).
std::vector<float> initial_values(const ParamSpec& spec, uint64_t model_seed);

class ParamStore {
 public:
  ParamStore(Backend& be, uint64_t model_seed) : be_(be), seed_(model_seed) {}
  // This rank's Param for the spec: created and initialised on the first request; later requests with
  // the same name return the same Param (shapes must agree).
  Param* get(const ParamSpec& spec);
  Param* find(const std::string& name);   // null when this rank holds no such parameter
  std::vector<Param*> all();              // in creation order

 private:
  Backend& be_;
  uint64_t seed_;
  std::deque<Param> params_;  // stable addresses
  std::map<std::string, Param*> by_name_;
};

}  // namespace relay
