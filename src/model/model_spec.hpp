// The registry of block kinds: from the config, the model as a list of BlockSpecs (shapes, parameter
// specs, FLOPs; each family's own, model/family.hpp) and the factory that builds one block. The only place
// that knows every kind.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "model/block.hpp"
#include "model/context_parallel.hpp"
#include "model/expert_parallel.hpp"
#include "model/param.hpp"

namespace relay {

// The model as the rest of Relay sees it: its blocks and the facts setup, data, schedules and
// checkpoints need, so that nothing outside src/model asks which model family it is.
struct ModelSpec {
  // A language model: reads token ids (sequences of seq_len tokens, data.train a token file), trains
  // with the next-token cross-entropy over the vocabulary, and can generate.
  bool language_model = false;
  std::vector<BlockSpec> blocks;
  int64_t seq_len = 1;      // rows per sample: T for a language model (a sample is a sequence), 1 for the MLP
  int64_t input_dim = 0;    // MLP: features per sample; language model: 0 (token ids)
  int64_t output_dim = 0;   // the loss's width: classes / targets (MLP) or vocab_size (language model)
  // Parameters used by more than one block (a tied embedding and head): one tensor, its gradient the sum.
  std::vector<std::string> tied() const;
  // One line per tp rank: what tensor parallelism gives rank r of tp ("heads [0, 6) of 12, ...").
  std::string tp_shard(int tp, int r) const;
};

// input_dim: the MLP's feature count (from the data); ignored for GPT. The blocks are model.type's family's
// (model/family.hpp).
ModelSpec make_model_spec(const Config& cfg, int64_t input_dim);

// The language models' first and last blocks (gpt_blocks.cpp's Embedding and Head, shared by the language-model
// families): token ids -> (rows, C) from the tables in params (the token embedding, [learned positions]);
// and a norm over C (params: its weight, [bias], then the output weight) -> logits over the vocabulary V.
BlockSpec lm_embedding(std::vector<ParamSpec> params, int64_t C, int64_t T);
BlockSpec lm_head(std::vector<ParamSpec> params, int64_t C, int64_t V, int64_t T, bool bias, NormKind norm, double eps);

// The buffers a block keeps per micro-batch slot of `rows` rows (its allocate_saved) and their bytes, and its output
// width on tp rank tp_rank (a tensor-parallel head's vocabulary shard): for memory plans, before anything runs.
std::vector<BufferSpec> saved_shapes(const BlockSpec& spec, int64_t rows, int tp);
int64_t saved_bytes(const BlockSpec& spec, int64_t rows, int tp);
int64_t block_out_width(const BlockSpec& spec, int tp, int tp_rank);

// Builds the block with its parameters taken from (or created in) the store; GPT blocks split their
// work over the stage's tensor-parallel group (tp.size == 1: the whole block).
// cp: the attention blocks' context-parallel group (parallel.cp); ep: the MoE layers' expert-parallel group, whose
// rank takes only its own experts' parameters from the store (parallel.ep).
std::unique_ptr<Block> make_block(const BlockSpec& spec, ParamStore& store, const TensorParallel& tp = {},
                                  const ContextParallel& cp = {}, const ExpertParallel& ep = {});

}  // namespace relay
