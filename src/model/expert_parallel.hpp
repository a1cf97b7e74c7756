// Expert parallelism (parallel.ep; GShard, Lepikhin et al. arXiv:2006.16668; Switch Transformer, Fedus et al.
// arXiv:2101.03961; Megatron-core's and torchtitan's layout): the E experts of every MoE layer are split over the ep
// ranks of an expert-parallel group, taken from the data-parallel ranks (ep consecutive dp ranks; ep divides dp),
// rank r holding experts [r E / ep, (r + 1) E / ep) whole. Each rank routes its own tokens; a layer sends every
// (token, expert) row to the rank holding the expert and gets the expert's output back, with two all-to-alls over
// the group (the row counts first, then the rows: dropless, no token is ever dropped, so every layout computes what
// the serial run does). Expert gradients are summed over the dp / ep ranks holding the same experts
// (ProcessGrid::expert_dp_comm), the dense ones over all dp ranks as before.
#pragma once
#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"
#include "model/block.hpp"

namespace relay {

class Tracer;

// What the all-to-alls of a rank cost over a step (the trainer logs it; relay's trace shows each one).
struct ExpertExchangeStats {
  Tracer* tracer = nullptr;  // this step's trace, or null
  int64_t trace_step = 0;
  double seconds = 0;        // host time in the all-to-alls (counts and rows) this step
  int64_t rows_sent = 0;     // rows this rank's dispatches sent to other ranks this step (the tokens' in the forward,
                             // their outputs' gradients in the backward; the returns are as many)
};

// A rank's expert-parallel group as a MoE layer sees it. comm is null when size == 1 (every expert here).
struct ExpertParallel {
  Communicator* comm = nullptr;
  int size = 1, rank = 0;
  std::shared_ptr<ExpertExchangeStats> stats;  // shared by the rank's MoE layers; null when size == 1
  bool on() const { return size > 1; }
  int64_t local_experts(int64_t E) const { return E / size; }
  int64_t first_expert(int64_t E) const { return int64_t(rank) * (E / size); }
  // Whether this rank holds parameter `i` of the block (every non-expert parameter; its own experts').
  bool holds(const BlockSpec& spec, size_t i) const;
};

// Whether expert parallelism pipelines each micro-batch's exchange in two parts (parallel.overlap; MoeSpec::parts, by
// the layout for MoE layers of two or more experts a rank): with ep > 1 on the CPU backend, whose MPI all-to-alls
// progress on the progress thread; NCCL's run in today's blocking order, said once at start. Run setup and the layout
// (and so the memory plan) ask.
inline bool ep_overlaps(bool overlap, int64_t ep, Device device) { return overlap && ep > 1 && device != Device::cuda; }

// The expert spec.params[i] belongs to (a MoE layer lists its router, then gate, up, down per expert): -1 for a
// block's other parameters. A block with inner blocks (DeepSeek-V3's MTP block: model/mtp_block.cpp) lists its inner
// MoE layers' parameters among its own, and their experts are split as the main layers' are.
int64_t expert_of_param(const BlockSpec& spec, size_t i);
// The routed experts of the layer spec.params[i] belongs to (spec.moe.n_experts, or its inner MoE layer's); 0 for a
// parameter of no MoE layer.
int64_t experts_of_param(const BlockSpec& spec, size_t i);
// The ep rank holding expert e of E.
inline int expert_owner(int64_t e, int64_t E, int ep) { return int(e / (E / ep)); }
// The ep rank holding spec.params[i]: -1 for a parameter of no expert (every ep rank holds it).
inline int expert_owner_of_param(const BlockSpec& spec, size_t i, int ep) {
  const int64_t e = expert_of_param(spec, i);
  return e < 0 ? -1 : expert_owner(e, experts_of_param(spec, i), ep);
}

}  // namespace relay
