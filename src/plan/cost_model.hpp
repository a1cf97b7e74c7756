// The compute side of the planner's cost model: one block's forward, backward-input and backward-weight time for one
// micro-batch on one rank of a device, from what the block states it costs (model/block_cost.hpp: its GEMMs,
// streamed elements, attention and collectives; the model layer knows the kinds, this file only the device) against
// the device's peaks (plan/cluster.hpp).
//
// GEMMs: time = max(2MNK / (peak x gemm_efficiency x wave_quantisation), bytes moved / bandwidth) + a launch,
// where gemm_efficiency is the device's best measured GEMM rate (the preset cites it) and wave quantisation
// the fraction of the last wave of 128 x 256 output tiles that has work (tiles / (ceil(tiles / SMs) x SMs)):
// the efficiency curve by shape, which falls for skinny or small GEMMs. Attention: FlashAttention-2's causal
// FLOPs (half the full score matrix; backward 2.5x the forward) at the device's attention efficiencies, or, as the
// named option PlannedAttention::materialised, the attention of Megatron-LM 2021 and other pre-FlashAttention code.
// Norms, activations, bias and residual adds: the elements they read and write over the streaming bandwidth, the
// backward twice the forward's. The tp, cp and ep collectives (plan/collectives.hpp) on the critical path.
// Recomputation (train.recompute = "blocks") runs the forward again before backward-input.
#pragma once
#include "core/precision.hpp"
#include "model/block.hpp"
#include "model/block_cost.hpp"
#include "plan/cluster.hpp"
#include "plan/collectives.hpp"

namespace relay {

// Seconds for y (M, N) = x (M, K) @ w (K, N) on the device in `precision`.
double gemm_s(const Cluster::Device& d, Precision precision, double M, double N, double K);
// Seconds to stream `bytes` through device memory (read + write counted by the caller).
double stream_s(const Cluster::Device& d, double bytes);

// The attention kernels the planner prices. flash: Relay's FlashAttention-2 (the scores stay on chip). materialised
// (`relay plan --attention materialised`; published rows of Megatron-LM 2021 state it): batched GEMMs over the whole
// (T, T) score matrix of each sequence and head, QK^T written to memory, a fused scaled masked softmax and dropout
// reading and writing it in the compute dtype (with a one-byte mask), att @ V reading it back; the backward's four
// batched GEMMs and the dropout and softmax backward over the same matrix.
enum class PlannedAttention { flash, materialised };

// The memory-bound kernels the planner prices. fused: Relay's (one kernel per norm, activation, RoPE: the blocks'
// Streaming). eager (`relay plan --elementwise eager`; the published torchtitan rows state it): PyTorch eager's
// decomposition of the same math as torchtitan's Llama writes it, each op its own kernel over the whole tensor: an
// RMSNorm as x.float(), pow, mean, rsqrt, mul, type_as and the weight's mul; RoPE as float, the complex product and
// type_as on q and k; SwiGLU as silu and mul; repeat_kv's copies of k and v under GQA; the attention output made
// contiguous; the loss's logits cast to f32 before log_softmax (model/block_cost.hpp: Streaming::eager_extra_per_row).
enum class PlannedElementwise { fused, eager };

// Both named choices of the kernels priced; a PlannedAttention alone converts (Relay's elementwise kernels).
struct PlannedKernels {
  PlannedAttention attention = PlannedAttention::flash;
  PlannedElementwise elementwise = PlannedElementwise::fused;
  PlannedKernels() = default;
  PlannedKernels(PlannedAttention a) : attention(a) {}  // NOLINT: implicit on purpose
  PlannedKernels(PlannedAttention a, PlannedElementwise e) : attention(a), elementwise(e) {}
};

// Where the block runs: its rows (tokens of the micro-batch on this rank), tp and cp groups, settings.
struct BlockContext {
  int64_t rows = 0;           // micro-batch tokens on the rank (samples x T / cp)
  int tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false, recompute = false;
  Precision precision = Precision::bf16;
  PlannedAttention attention = PlannedAttention::flash;
  PlannedElementwise elementwise = PlannedElementwise::fused;
  GroupPath tp_path, cp_path, ep_path;
  // parallel.overlap: context parallelism's key/value all-gathers travel while the rank's queries attend to its own
  // rows (model/context_parallel.cpp), 1/cp of the attention work: min(gather, that part) of each gather is hidden.
  // Expert parallelism's all-to-alls (model/moe.cpp's two parts, each rank's experts halved): min(one all-to-all,
  // the routed experts' GEMMs) of the forward's and of the backward's pair.
  // Tensor parallelism's backward all-reduces travel behind the column-parallel weight gradients
  // (BlockCollective::behind_weight_grads): min(all-reduce, those GEMMs) of each is hidden (under sequence parallelism
  // min(reduce-scatter, those GEMMs): the reduce-scatter half of the entry), unless B and W run apart (split_backward:
  // zero-bubble schedules).
  bool overlap = false, split_backward = false;
  // The tensor- and expert-parallel overlaps above need the backend to run them (model/tensor_parallel.hpp
  // tp_overlaps, model/expert_parallel.hpp ep_overlaps: the CPU backend's for now; CUDA runs today's order):
  // parallel.overlap and the cluster's device.backend through those same two functions (step_groups).
  bool tp_overlap = false, ep_overlap = false;
  // train.precision = "fp8": the weights' FP8 codes are cached (model/param.hpp's Fp8WeightCache), quantised once an
  // optimizer step (BlockTime::fp8_weights) instead of in each micro-batch's forward and input gradient; false under
  // ZeRO-3, which gathers each weight for its use and keeps no codes.
  bool fp8_weights_cached = false;
};

struct BlockTime {
  double forward = 0, backward_input = 0, backward_weight = 0;  // seconds, collectives included
  double comm_forward = 0, comm_backward = 0;                   // of which tp / cp / ep collectives (critical path)
  double ep_forward = 0, ep_backward = 0;                       // of which the ep all-to-alls
  double cp_hidden = 0;  // seconds of the cp key/value all-gathers hidden behind the own rows' attention (overlap)
  double ep_hidden = 0;  // seconds of the ep all-to-alls hidden behind the other part's experts (overlap)
  double tp_hidden = 0;  // seconds of the tp input-gradient all-reduces hidden behind weight gradients (overlap)
  // Seconds an optimizer step (not a micro-batch) quantising the block's weights for their cached FP8 codes
  // (BlockContext::fp8_weights_cached); then forward and backward_input hold no weight quantisation.
  double fp8_weights = 0;
};
BlockTime block_time(const Cluster::Device& d, const BlockSpec& b, const BlockContext& ctx);

// Seconds for AdamW (or SGD) over `elements` fp32 parameters of the rank (masters, gradients, moments,
// the working bf16 copy) and the gradient norm: memory-bound.
double optimizer_s(const Cluster::Device& d, double elements, bool mixed);

}  // namespace relay
