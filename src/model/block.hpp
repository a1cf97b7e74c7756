// Blocks: the coarse units a model is cut into for pipeline stages. An MLP block is one config layer
// (linear, activation, layernorm); a language model is embedding -> n_layer decoder blocks (GPT-2's
// transformer or Llama's decoder layer) -> head.
// A block maps its input activation (rows, in) to (rows, out) and keeps, per micro-batch slot, the
// tensors its backward needs. Its parameters are handles into the ParamStore (param_store.hpp).
#pragma once
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "model/param.hpp"

namespace relay {

enum class BlockKind { linear, relu, gelu, tanh, layernorm, embedding, transformer, llama_layer, mla_layer, mtp, head };
// The normalisation a language model's blocks use: GPT-2's LayerNorm or Llama's RMSNorm (weight only).
enum class NormKind { layernorm, rmsnorm };
const char* block_kind_name(BlockKind k);

// A decoder layer's mixture of experts (model/moe.hpp); n_experts 0: the layer's MLP is dense.
struct MoeSpec {
  int64_t n_experts = 0;
  int64_t k = 0;             // experts per token (top-k)
  int64_t ffn_hidden = 0;    // one expert's SwiGLU units
  bool renormalize = true;   // the k weights divided by their sum (Mixtral; Qwen3-MoE's norm_topk_prob)
  // The loss's weight on this layer's terms: router_aux_loss_coef / (MoE layers x sequences of the global batch) on
  // each sequence's aux, router_z_loss_coef / (MoE layers x tokens of the global batch) on each token's lse^2.
  double aux_weight = 0, z_weight = 0;
  int layer = -1;            // this layer's place among the model's MoE layers (logs, the expert bias)
  bool expert_bias = false;  // moe.expert_bias: a per-expert bias on the top-k choice (model/moe.hpp)
  int ep = 1;                // parallel.ep: the experts are split over ep ranks (model/expert_parallel.hpp)
  int cp = 1;                // parallel.cp: a rank holds T / cp rows of each sequence (its statistics summed over cp)
  // parallel.overlap under ep (ep_overlaps): 2, a micro-batch's rows exchanged in two parts (those of each rank's first
  // half of its experts, then the rest's) whose all-to-alls travel while the other part's experts compute
  // (model/moe.cpp); 1, all at once.
  int parts = 1;
  // router_aux_loss_coef and router_z_loss_coef themselves: the trainer's router terms of the logged loss.
  double aux_coef = 0, z_coef = 0;
  // DeepSeek-V3 (arXiv:2412.19437 section 2.1.2; transformers' DeepseekV3MoE): sigmoid scores with a group-limited
  // top-k (n_group groups, the topk_group best kept; 1 / 1: no grouping), the chosen weights times routed_scaling
  // (routed_scaling_factor), and with either score n_shared always-on shared experts: one SwiGLU of n_shared x
  // ffn_hidden units on every token, added to the routed experts' sum. expert_bias above is its
  // e_score_correction_bias. The defaults are Mixtral's and Qwen3-MoE's (softmax, no groups, no scale, none shared).
  enum class Score { softmax, sigmoid };
  Score score = Score::softmax;
  int64_t n_group = 1, topk_group = 1;  // sigmoid only
  double routed_scaling = 1.0;          // sigmoid only
  int64_t n_shared = 0;
  bool on() const { return n_experts > 0; }
  int64_t shared_hidden() const { return n_shared * ffn_hidden; }
};

// DeepSeek-V2/V3's multi-head latent attention (model/mla_blocks.cpp): queries through a low-rank q_lora_rank (0: one
// q_proj), keys and values through a kv_lora_rank latent, heads of qk_nope + qk_rope query/key columns (rotary on the
// last qk_rope only, one rotary key per token shared by every head) and v_head value columns.
struct MlaSpec {
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  bool rope_interleave = true;  // transformers' rope_interleave: rotary pairs (2i, 2i + 1) instead of (i, i + d/2)
  RopeScaling rope_scaling;     // YaRN's rotary tables (model.rope_scaling = "yarn"), else plain
  double qk_scale = 1.0;        // the softmax scale's factor over 1 / sqrt(qk_head()): YaRN's mscale^2
  int64_t qk_head() const { return qk_nope + qk_rope; }
};

// DeepSeek-V3's multi-token prediction (arXiv:2412.19437 section 2.2; model/mtp_block.cpp): `depth` sequential modules
// on the final hidden states before the final norm, module k predicting the token k + 1 positions ahead; the loss adds
// weight / depth x sum_k CE_k, CE_k the mean over the global batch's counted positions of depth k (MtpBatch).
struct MtpSpec {
  int64_t depth = 0;       // D = model.num_mtp_layers
  double weight = 0;       // model.mtp_loss_weight
};

// A training micro-batch as the multi-token prediction block reads it: host arrays over the micro-batch's whole
// sequences (every cp rank has them all; the block picks its own rows after shifting).
struct MtpBatch {
  const int32_t* targets = nullptr;    // (samples x T) next-token targets, -1 where the main loss counts none
                                       // (data.document_mask: the end-of-text inputs); null: evaluation
  const int32_t* doc_start = nullptr;  // (samples x T) each position's document start (model/documents.hpp), or null
  const int64_t* counted = nullptr;    // (depth) per module k, the global batch's counted positions: CE_k's mean's
                                       // denominator (model/documents.hpp, counted_mtp_targets)
};

// Everything known about a block before anything is allocated: what the partitioner, `relay plan`,
// the checkpoint manifest and the factory need. Made by model_spec.cpp, the one place that knows
// every kind.
struct BlockSpec {
  BlockKind kind;
  int index = 0;            // position in the model, 0-based
  int64_t in = 0, out = 0;  // activation widths per row; in == 0: the input is token ids (rows) i32
  std::vector<ParamSpec> params;
  double flops = 0;         // forward FLOPs per row (sample for the MLP, token for GPT)
  double attn_flops = 0;    // of which the attention's scores and weighted sums (QK^T, att @ V), per row
  bool recomputable = false;  // train.recompute = "blocks" recomputes it (decoder blocks)
  // kind-specific settings
  double eps = 1e-5;        // layernorm, transformer, llama_layer, head
  NormKind norm = NormKind::layernorm;  // head
  int64_t n_head = 0;       // transformer, llama_layer
  int64_t n_kv_head = 0;    // llama_layer: key/value heads (grouped-query attention)
  int64_t ffn_hidden = 0;   // llama_layer: SwiGLU hidden units
  double rope_theta = 10000;  // llama_layer: rotary base
  int64_t head_dim = 0;     // llama_layer: each head's width; 0: in / n_head
  bool qk_norm = false;     // llama_layer: RMSNorm over each query and key head (Qwen3's q_norm, k_norm)
  MoeSpec moe;              // llama_layer: its MLP's experts (off: the dense SwiGLU of ffn_hidden units)
  MlaSpec mla;              // mla_layer: its latent attention's widths (n_head heads, ffn_hidden SwiGLU units)
  int64_t seq_len = 1;      // T: rows per sequence (language models), 1 for the MLP
  bool bias = true;         // transformer, head: Linear and LayerNorm biases
  bool starts_unit = true;  // a stage may begin here (false for an MLP's parameter-free layer)
  DType dtype = DType::f32; // activations, their gradients and working weights (train.precision)
  // train.precision = "fp8": this block's linear layers run their GEMMs in FP8 with this recipe (model/fp8_linear.hpp;
  // set for the transformer, Llama and MLP linear blocks, not for the embedding, the head or the experts).
  std::optional<Fp8Recipe> fp8;
  // Sequence parallelism (parallel.sequence_parallel, model/tensor_parallel.hpp): the activations between blocks are
  // split by rows over sp = tp ranks; 1 without it.
  int sp = 1;
  // mtp: its modules' parts, module k's at [3 (k - 1), 3 k): its transformer block (an mla_layer), the shared head
  // (an lm_head of shared_head.norm and the output weight) and the shared embedding (an lm_embedding); params holds
  // the embedding, the output weight, then per module enorm, hnorm, eh_proj and its block's and head's own.
  MtpSpec mtp;
  std::vector<BlockSpec> inner;
};

// An attention block's head width: Qwen3's explicit head_dim, else in / n_head.
inline int64_t head_dim(const BlockSpec& s) { return s.head_dim > 0 ? s.head_dim : s.in / s.n_head; }

// Rows of a block's input and output for a micro-batch of n rows (tokens): n / sp under sequence parallelism,
// except the embedding's input (token ids, every row) and the head's output (every row's logits).
inline int64_t block_in_rows(const BlockSpec& s, int64_t n) { return s.kind == BlockKind::embedding ? n : n / s.sp; }
inline int64_t block_out_rows(const BlockSpec& s, int64_t n) { return s.kind == BlockKind::head ? n : n / s.sp; }

// One buffer a block keeps per micro-batch: its shape and dtype (statistics stay f32 under bf16).
// backward: the buffer holds nothing from the forward to the backward: backward_input writes it for backward_weight,
// or a call uses it as scratch. Where a chunk runs every block's backward_input and
// backward_weight back to back (all schedules but zero-bubble ones), such buffers are shared by all its blocks and
// micro-batches (SharedBuffers) instead of kept per block and micro-batch.
struct BufferSpec {
  Shape shape;
  DType dtype = DType::f32;
  bool backward = false;
  int64_t bytes() const { return shape_numel(shape) * int64_t(dtype_size(dtype)); }
};

// The backward buffers one chunk's blocks share: one tensor per (place in a block's list, shape, dtype), so no two
// buffers of one block are the same memory while blocks of any kind reuse each other's.
class SharedBuffers {
 public:
  Tensor get(Backend& be, size_t index, const BufferSpec& spec);
  // Bytes of the distinct buffers `lists` (each block's specs) would share: the same rule as get().
  static int64_t planned_bytes(const std::vector<std::vector<BufferSpec>>& lists);
  // What makes two buffers one (ChunkBytesPlanner interns them).
  using Key = std::tuple<size_t, DType, Shape>;
  static Key key(size_t index, const BufferSpec& spec) { return {index, spec.dtype, spec.shape}; }

 private:
  std::map<Key, Tensor> t_;
};

// Tensors one block keeps for one micro-batch in flight (its input is kept by the chunk). shared: where its
// backward buffers come from (null: its own).
struct BlockSaved {
  std::vector<Tensor> t;
  SharedBuffers* shared = nullptr;
};
// The buffers of specs, allocated into saved.t (the backward ones from saved.shared when there is one).
void allocate_buffers(Backend& be, const std::vector<BufferSpec>& specs, BlockSaved& saved);
void allocate_buffers(Backend& be, const std::vector<BufferSpec>& specs, std::vector<Tensor>& out);

// What a MoE layer's router saw over one training step (all its micro-batches), for the loss and the logs.
struct RouterStats {
  int layer = -1;               // MoeSpec::layer
  double aux_sum = 0;           // sum over sequences of aux_{l,s} (model/moe.hpp)
  double z_sum = 0;             // sum over tokens of lse^2
  std::vector<double> tokens;   // (n_experts) tokens routed to each expert
  // The smallest gap between a token's k-th and (k+1)-th router probability: where it nears float rounding, two
  // correct layouts may route that token differently (infinity when k = n_experts).
  double min_margin = INFINITY;
};

class Block {
 public:
  Block(BlockSpec spec, std::vector<Param*> params) : spec_(std::move(spec)), params_(std::move(params)) {}
  virtual ~Block() = default;
  const BlockSpec& spec() const { return spec_; }
  const std::vector<Param*>& params() const { return params_; }
  // This rank's output width: spec().out, or its vocabulary shard for a tensor-parallel head.
  virtual int64_t out_width() const { return spec_.out; }

  // Sizes `saved` for `rows` rows (once per slot; reused every step).
  virtual void allocate_saved(Backend&, int64_t rows, BlockSaved&) {}
  // x (rows, in) -> y (rows, out); token ids x i32 (rows) when spec().in == 0.
  virtual void forward(Backend& be, const Tensor& x, Tensor& y, BlockSaved& saved) = 0;
  // dy (rows, out) -> dx (rows, in), from the saved input x. Never called when in == 0.
  virtual void backward_input(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& saved) = 0;
  // Accumulates the parameter gradients (Param::grad) from dy and the saved input x.
  virtual void backward_weight(Backend&, const Tensor&, const Tensor&, BlockSaved&) {}
  // B and W back to back (every schedule but zero-bubble ones). A block whose weights_in_backward() then computes
  // some weight gradients inside the input-gradient pass (early_weights_), while a collective travels (tensor
  // parallelism's asynchronous input-gradient all-reduce, model/tensor_parallel.hpp), and skips them in
  // backward_weight. The chunk runs it between the weight-gradient hooks.
  void backward(Backend& be, const Tensor& x, const Tensor& dy, Tensor& dx, BlockSaved& saved) {
    early_weights_ = weights_in_backward();
    backward_input(be, x, dy, dx, saved);
    backward_weight(be, x, dy, saved);
    early_weights_ = false;
  }
  virtual bool weights_in_backward() const { return false; }

  // The micro-batch's sequence layout, i32 (rows) each on the block's backend, set by the chunk before it runs the
  // block on that micro-batch: data.document_mask's document starts (attention keeps within documents;
  // model/documents.hpp), the positions the embeddings read (restarting with each document, or a row's place in
  // its sequence under context parallelism), and under context parallelism each row's place in its sequence
  // (q_pos; model/context_parallel.hpp). Each undefined when not in use.
  void set_documents(const Tensor& doc_start, const Tensor& positions, const Tensor& q_pos = Tensor()) {
    doc_start_ = doc_start;
    positions_ = positions;
    q_pos_ = q_pos;
  }

  // Multi-token prediction (BlockKind::mtp): the micro-batch's targets and document layout, set before a training
  // forward on the last stage (targets null: evaluation, the block passes its input through and predicts nothing).
  virtual void set_targets(const MtpBatch&) {}
  // Adds this block's per-module sums of CE_k over the training micro-batches since the last call into sums (depth
  // of them), and resets them.
  virtual void take_mtp_stats(std::vector<double>&) {}

  // Appends this block's router statistics of the training micro-batches since the last call, and resets them
  // (MoE layers; other blocks have none).
  virtual void take_router_stats(std::vector<RouterStats>&) {}
  // moe.expert_bias: every MoE layer's bias, (MoE layers, n_experts) on the host; a MoE layer takes its row.
  virtual void set_expert_bias(Backend&, const std::vector<float>& /*bias*/) {}

  // Generation (relay generate: one rank, whole blocks), one position at a time with a cache.
  // allocate_decode sizes `cache` for n sequences of up to max_len positions (key-value caches and
  // one-position scratch); decode runs position t of each sequence: x (n, in) -> y (n, out), x token
  // ids i32 (n) when spec().in == 0, reading positions [0, t) from the cache and adding position t.
  // Blocks that cannot generate (the MLP's) keep the defaults, which refuse.
  virtual bool can_decode() const { return false; }
  virtual void allocate_decode(Backend&, int64_t /*n*/, int64_t /*max_len*/, BlockSaved&) {}
  virtual void decode(Backend&, const Tensor&, Tensor&, int64_t /*t*/, BlockSaved&) {
    RELAY_ASSERT(false, block_kind_name(spec_.kind) << " blocks cannot generate");
  }
  // What one position of one sequence adds to this block's decode cache (bytes 0: it keeps none), what a standard
  // key-value cache of the same heads would hold (every head's key and value at full width: the same as bytes for
  // the blocks that keep one), and the values per position, for a reader ("2 x 2 key/value heads x 16").
  struct DecodeCache {
    int64_t bytes = 0, standard_bytes = 0;
    std::string values;
  };
  virtual DecodeCache decode_cache() const { return {}; }

 protected:
  bool early_weights_ = false;  // inside backward() of a block whose weights_in_backward(): see backward()
  Tensor doc_start_, positions_, q_pos_;  // set_documents: (rows) i32, or undefined
  Param& param(size_t i) { return *params_[i]; }
  BlockSpec spec_;
  std::vector<Param*> params_;  // in spec_.params order
};

}  // namespace relay
