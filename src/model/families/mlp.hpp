// The MLP's [model] keys (model.type = "mlp", mlp.cpp): its layers in order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace relay {

struct LayerConfig {        // one entry of model.layers
  std::string type;         // linear | relu | gelu | tanh | layernorm
  int64_t out = 0;          // linear only
  double eps = 1e-5;        // layernorm only
};

struct MlpArgs : FamilyArgs {
  std::vector<LayerConfig> layers;
  std::unique_ptr<FamilyArgs> clone() const override { return std::make_unique<MlpArgs>(*this); }
};

}  // namespace relay
