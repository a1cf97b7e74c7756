// What a block costs, stated once by its kind (Megatron-LM keeps one num_floating_point_operations): its GEMM shapes,
// the elements its memory-bound kernels stream, its attention, its forward FLOPs (a MoE layer's k active experts only)
// and the collectives it waits for over each parallel dimension. The planner turns this into seconds on a device
// (plan/cost_model.hpp) and measures a device at these shapes (plan/calibration.hpp); the trainer's logged MFU and
// `relay plan`'s predicted MFU count the same model_flops_per_row. The buffers a block keeps per micro-batch are its
// saved_shapes (model_spec.hpp), which the memory plan reads through ModelChunk::planned_bytes.
#pragma once
#include <cstdint>
#include <vector>

#include "model/block.hpp"

namespace relay {

struct ModelSpec;  // model_spec.hpp

// `count` GEMMs y (M, N) = x (M, K) @ w (K, N) in the forward; the backward runs each twice more, dX (M, K) = dY w^T
// and dW (K, N) = x^T dY.
struct Gemm {
  double M, N, K, count = 1;
};

// Elements the memory-bound kernels (norms, activations, biases, residual adds, RoPE, routing, the loss) read and write
// per row, and how many kernels they are. eager_extra: what PyTorch eager's decomposition of the same math moves
// besides, one kernel per op (the planner's named option PlannedElementwise::eager, plan/cost_model.hpp), in elements
// of the working dtype (an f32 copy of a bf16 tensor counts twice).
struct Streaming {
  double elements_per_row = 0;
  int kernels = 0;
  double eager_extra_per_row = 0;
  int eager_extra_kernels = 0;
};

enum class ParallelDim { tp, cp, ep };
enum class CollectiveOp { all_reduce, all_gather, reduce_scatter, all_to_all };

// `count` collectives of one kind over one parallel dimension's group, in the forward or the backward, each over a
// buffer of `elements` in the activations' dtype plus `bytes` of fixed width (f32 statistics, i64 counts): the whole
// buffer as plan/collectives.hpp takes it. Relay does not overlap them: the block waits for each.
struct BlockCollective {
  ParallelDim dim = ParallelDim::tp;
  CollectiveOp op = CollectiveOp::all_reduce;
  bool backward = false;
  double count = 1;
  double elements = 0, bytes = 0;
  // Indices into BlockCost::gemms whose weight-gradient GEMMs this backward collective travels behind under
  // parallel.overlap: tensor parallelism's asynchronous input-gradient all-reduce (model/tensor_parallel.hpp), the
  // column-parallel projections whose input gradient it sums. Empty: on the critical path.
  std::vector<int> behind_weight_grads;
  // Under sequence parallelism, a forward all-gather run as a collective matmul with parallel.overlap
  // (model/collective_matmul.hpp): the column-parallel GEMMs (indices into gemms) its chunks feed.
  std::vector<int> gather_feeds;
  // And its reduce-scatter run the same way: the row-parallel GEMMs (indices into gemms) whose chunks produce it.
  std::vector<int> scatter_from;
  // A backward entry's all-gather (of the output gradient, of d res1) run as a collective matmul: the row-parallel
  // GEMMs (indices into gemms) whose input-gradient GEMMs its chunks feed.
  std::vector<int> backward_gather_feeds;
  double buffer_bytes(double dtype_bytes) const { return dtype_bytes * elements + bytes; }
};

// An attention block's heads: query heads, the key/value heads they share, each head's width; packed_qkv: the block
// projects q, k and v into one (rows, 3 C) tensor (GPT-2's c_attn) and runs the packed flash attention. v_head_dim:
// the value heads' width where it differs (MLA's v_head_dim against qk_nope + qk_rope), else 0.
struct AttentionShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  bool packed_qkv = false;
  int64_t v_head_dim = 0;
  bool on() const { return heads > 0; }
  int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};
AttentionShape attention_shape(const BlockSpec& spec);

// Where a block runs: its tensor-parallel group (tp), the rows between blocks split over sp = tp ranks under sequence
// parallelism (else sp = 1), the ranks sharing each sequence (cp) and splitting the experts (ep).
struct BlockShard {
  int tp = 1, sp = 1, cp = 1, ep = 1;
};

struct BlockCost {
  // One tp rank's, for the rows block_cost was given (a MoE layer's E / ep local experts each on n k ep / E rows:
  // balanced routing, model/moe.hpp).
  std::vector<Gemm> gemms;
  // The forward's; the backward moves about twice as much (each kernel reads the forward's input and the output
  // gradient and writes the input gradient, plus the bias and norm-weight reductions) in about twice the kernels.
  Streaming forward_streaming;
  Streaming weight_streaming;  // backward-weight's besides its GEMMs (a dense Llama layer remakes its SwiGLU output)
  // Per row, the whole block's (all tp ranks'): everything its forward computes, and of it the attention's QK^T and
  // att @ V over the whole sequence (causal attention computes half of these).
  double forward_flops_per_row = 0, attention_flops_per_row = 0;
  AttentionShape attention;  // heads 0: no attention
  int64_t mlp_hidden = 0;    // the MLP's hidden width (one expert's under MoE); 0: no MLP
  // A MoE layer's: gemms[routed_gemm] (gate and up) and gemms[routed_gemm + 1] (down) are the routed experts' (what
  // expert parallelism's all-to-alls overlap, plan/cost_model.cpp); 0 without experts.
  size_t routed_gemm = 0;
  // The ones this shard runs (a dimension of one runs none), on the same rows.
  std::vector<BlockCollective> collectives;
};

// The cost of `spec` on one rank of `shard` for a micro-batch of `rows` rows on that rank (its tokens: samples x T /
// cp). The one place, with the factory and the saved shapes (model_spec.hpp), that switches on the block's kind.
BlockCost block_cost(const BlockSpec& spec, const BlockShard& shard, double rows);

// Training FLOPs per row (a token of a language model, a sample of the MLP): 3 x the blocks' forward FLOPs (the
// forward, and the backward's two products per forward one), attention included, a MoE layer's k active experts
// only, recomputation not counted. What MFU counts, in the trainer's log and in `relay plan`.
double model_flops_per_row(const ModelSpec& model);
// The forward FLOPs per row that train.recompute = "blocks" runs again (hardware FLOPs = model + these).
double recomputed_flops_per_row(const ModelSpec& model);
// The parameters a row uses: every parameter once (a tied one once), of a MoE layer's experts k of E.
double active_parameters(const ModelSpec& model);

}  // namespace relay
