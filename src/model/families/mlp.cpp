// The MLP (model.type = "mlp"): one block per model.layers entry, initialised as torch.nn.Linear / LayerNorm
// from (model.seed, layer index), named as torch.nn.Sequential's state_dict ("0.weight", "0.bias", ...).
#include <cmath>

#include "model/families/mlp.hpp"
#include "model/family.hpp"

namespace relay {

namespace {

class MlpFamily final : public ModelFamily {
 public:
  const char* name() const override { return "mlp"; }
  bool language_model() const override { return false; }
  std::set<std::string> keys() const override { return {"layers"}; }

  void parse_keys(const ConfigSection& model, Config::Model& m) const override {
    MlpArgs& a = m.edit_args<MlpArgs>();
    auto* layers = model.get("layers");
    if (!layers) model.fail("layers", "required key is missing");
    if (!layers->is_array()) model.fail("layers", cat("expected an array of tables, got ", toml_type_name(*layers)));
    const std::string source = model.source();
    int idx = 0;
    for (auto& ln : *layers->as_array()) {
      std::string lname = cat("layers[", idx, "]");
      if (!ln.is_table()) model.fail(lname, "expected a table like { type = \"linear\", out = 256 }");
      ConfigSection l(ln.as_table(), cat("model.layers[", idx, "]"), source, {"type", "out", "eps"});
      LayerConfig lc;
      l.choice("type", lc.type, {"linear", "relu", "gelu", "tanh", "layernorm"});
      if (lc.type == "linear") l.integer("out", lc.out, 1, int64_t(1) << 31, true);
      else if (l.get("out")) l.fail("out", cat("only linear layers take 'out' (this layer is ", lc.type, ")"));
      if (lc.type == "layernorm") l.real("eps", lc.eps, 0, 1, true);
      else if (l.get("eps")) l.fail("eps", cat("only layernorm layers take 'eps' (this layer is ", lc.type, ")"));
      a.layers.push_back(lc);
      ++idx;
    }
    if (a.layers.empty()) model.fail("layers", "must hold at least one layer");
    bool any_linear = false;
    for (auto& l : a.layers) any_linear |= l.type == "linear";
    if (!any_linear) model.fail("layers", "needs at least one linear layer");
  }

  void write_keys(std::ostream& o, const Config::Model& m) const override {
    o << "layers = [\n";
    for (auto& l : m.args<MlpArgs>().layers) {
      o << "  { type = " << toml_quote(l.type);
      if (l.type == "linear") o << ", out = " << l.out;
      if (l.type == "layernorm") o << ", eps = " << toml_number(l.eps);
      o << " },\n";
    }
    o << "]\n";
  }

  ModelSpec blocks(const Config& cfg, int64_t input_dim) const override {
    ModelSpec m;
    m.input_dim = input_dim;
    int64_t w = input_dim;
    const auto& layers = cfg.model.args<MlpArgs>().layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerConfig& l = layers[i];
      BlockSpec b;
      b.in = w;
      const std::string n = std::to_string(i);
      if (l.type == "linear") {
        b.kind = BlockKind::linear;
        b.out = l.out;
        // torch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound
        // and continues the weight's random stream.
        const double bound = 1.0 / std::sqrt(double(w));
        b.params = {fp8_gemm({n + ".weight", {l.out, w}, {ParamInit::uniform, bound, i, 0}}),
                    {n + ".bias", {l.out}, {ParamInit::uniform, bound, i, static_cast<uint64_t>(l.out * w)}}};
        b.flops = 2.0 * double(w) * double(l.out);
      } else if (l.type == "layernorm") {
        b.kind = BlockKind::layernorm;
        b.out = w;
        b.eps = l.eps;
        b.params = {{n + ".weight", {w}, param_constant(1)}, {n + ".bias", {w}, param_constant(0)}};
        b.flops = 8.0 * double(w);
      } else {
        b.kind = l.type == "relu" ? BlockKind::relu : l.type == "gelu" ? BlockKind::gelu : BlockKind::tanh;
        b.out = w;
        b.flops = (l.type == "gelu" ? 10.0 : 1.0) * double(w);
        b.starts_unit = false;  // parameter-free layers stay with the layer before them
      }
      w = b.out;
      m.blocks.push_back(std::move(b));
    }
    if (!m.blocks.empty()) m.blocks.front().starts_unit = true;
    m.output_dim = w;
    return m;
  }
};

}  // namespace

const ModelFamily& mlp_family() {
  static const MlpFamily f;
  return f;
}

}  // namespace relay
