// Factories of the block kinds, one per model family; model_spec.cpp chooses among them.
#pragma once
#include <memory>
#include <vector>

#include "model/block.hpp"

namespace relay {

// params: the block's Params in spec.params order.
std::unique_ptr<Block> make_mlp_block(const BlockSpec& spec, std::vector<Param*> params);  // mlp_blocks.cpp
std::unique_ptr<Block> make_gpt_block(const BlockSpec& spec, std::vector<Param*> params,  // gpt_blocks.cpp
                                      const TensorParallel& tp);

}  // namespace relay
