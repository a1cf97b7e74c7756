// Factories of the block kinds, one per model family; model_spec.cpp chooses among them.
#pragma once
#include <memory>
#include <vector>

#include "model/block.hpp"
#include "model/context_parallel.hpp"
#include "model/expert_parallel.hpp"

namespace relay {

// params: the block's Params in spec.params order.
std::unique_ptr<Block> make_mlp_block(const BlockSpec& spec, std::vector<Param*> params);  // mlp_blocks.cpp
// cp: the attention blocks' context-parallel group (model/context_parallel.hpp).
std::unique_ptr<Block> make_gpt_block(const BlockSpec& spec, std::vector<Param*> params,  // gpt_blocks.cpp
                                      const TensorParallel& tp, const ContextParallel& cp = {});
// The shapes a block's allocate_saved makes for `rows` rows at tensor-parallel size tp (memory plans).
std::vector<BufferSpec> gpt_saved_shapes(const BlockSpec& spec, int64_t rows, int tp);
// ep: the MoE layers' expert-parallel group; params then hold this rank's experts only (model/expert_parallel.hpp).
std::unique_ptr<Block> make_llama_block(const BlockSpec& spec, std::vector<Param*> params,  // llama_blocks.cpp
                                        const TensorParallel& tp, const ContextParallel& cp = {},
                                        const ExpertParallel& ep = {});
std::vector<BufferSpec> llama_saved_shapes(const BlockSpec& spec, int64_t rows, int tp);
std::vector<BufferSpec> mlp_saved_shapes(const BlockSpec& spec, int64_t rows);
// DeepSeek-V3's decoder layer with multi-head latent attention and a dense SwiGLU or (spec.moe on) DeepSeek-V3's
// mixture of experts (mla_blocks.cpp); ep as make_llama_block's.
std::unique_ptr<Block> make_mla_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                      const ContextParallel& cp = {}, const ExpertParallel& ep = {});
std::vector<BufferSpec> mla_saved_shapes(const BlockSpec& spec, int64_t rows, int tp);
// DeepSeek-V3's multi-token prediction modules (mtp_block.cpp): spec.inner's blocks, params as BlockSpec::inner says.
std::unique_ptr<Block> make_mtp_block(const BlockSpec& spec, std::vector<Param*> params, const TensorParallel& tp,
                                      const ContextParallel& cp,
                                      const ExpertParallel& ep = {});
std::vector<BufferSpec> mtp_saved_shapes(const BlockSpec& spec, int64_t rows, int tp);

}  // namespace relay
