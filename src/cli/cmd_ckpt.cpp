// relay ckpt inspect FILE: step, layout and tensors of a checkpoint, after checking it is complete
// and that every tensor reads back. relay ckpt export FILE: its weights for PyTorch or transformers.
#include <cstdio>
#include <vector>

#include "cli/commands.hpp"
#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/config.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "model/family.hpp"
#include "model/hf_model.hpp"

namespace relay {

CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& o, CLI::App** inspect, CLI::App** export_cmd) {
  auto* c = app.add_subcommand("ckpt", "Work with checkpoints");
  c->require_subcommand(1);
  auto* i = c->add_subcommand("inspect", "Print a checkpoint's step, layout and tensors; check it is complete");
  i->add_option("file", o.file, "Checkpoint file (step_XXXXXXXX.h5)")->required();
  *inspect = i;
  auto* e = c->add_subcommand("export", "Write a checkpoint's weights as safetensors named as PyTorch's state_dict, or as a Hugging Face model directory");
  e->add_option("file", o.file, "Checkpoint file (step_XXXXXXXX.h5)")->required();
  e->add_option("--out", o.out, "Output .safetensors file, or directory with --format hf")->required();
  e->add_option("--format", o.format,
                "safetensors: one file named as the PyTorch module's state_dict (default); hf: a Hugging Face "
                "model directory (config.json, model.safetensors) for transformers' from_pretrained")
      ->check(CLI::IsMember({"safetensors", "hf"}));
  e->add_option("--dtype", o.dtype, "fp32 | bf16: the stored weights' type")->check(CLI::IsMember({"fp32", "bf16"}));
  *export_cmd = e;
  return c;
}

int run_ckpt_inspect(const CkptOptions& o) {
  CheckpointReader r(o.file);
  const auto& m = r.meta();
  std::printf("checkpoint %s\n  format relay-checkpoint v%d, step %lld, complete\n", o.file.c_str(), kCheckpointVersion,
              static_cast<long long>(m.step));
  std::printf("  written under dp = %lld, tp = %lld, pp = %lld, schedule = %s, virtual_stages = %lld%s (whole "
              "tensors: any layout resumes)\n",
              static_cast<long long>(m.dp), static_cast<long long>(m.tp), static_cast<long long>(m.pp),
              m.schedule.c_str(), static_cast<long long>(m.virtual_stages), m.zero ? cat(", ZeRO-", m.zero).c_str() : "");
  std::printf("  optimizer %s, %lld updates; data position %lld (epoch %lld of %lld samples, batch %lld)\n",
              m.optimizer.c_str(), static_cast<long long>(m.optimizer_step), static_cast<long long>(m.position),
              static_cast<long long>(m.epoch), static_cast<long long>(m.samples), static_cast<long long>(m.batch_size));
  int64_t total = 0, nonfinite = 0;
  std::vector<float> buf;
  auto tensors = r.tensors();
  std::printf("  %zu tensors:\n", tensors.size());
  for (auto& [name, shape] : tensors) {
    buf.resize(static_cast<size_t>(shape_numel(shape)));
    r.read(name, shape, buf.data());  // every byte must read back
    total += shape_numel(shape);
    const auto bad = std::count_if(buf.begin(), buf.end(), [](float v) { return !std::isfinite(v); });
    nonfinite += bad;
    std::printf("    %-40s %s%s\n", name.c_str(), shape_str(shape).c_str(),
                bad ? cat("  (", bad, " non-finite)").c_str() : "");
  }
  // A diverged run saves NaN weights faithfully; say so rather than call the file healthy.
  if (nonfinite) std::printf("  %lld values, all readable, %lld non-finite\n", static_cast<long long>(total),
                             static_cast<long long>(nonfinite));
  else std::printf("  %lld values, all readable, all finite\n", static_cast<long long>(total));
  return 0;
}

}  // namespace relay

namespace relay {

// The model's tensors (not the optimizer's), named as the equivalent PyTorch module's state_dict: the
// MLP as torch.nn.Sequential ("0.weight", ...), GPT as nanoGPT's module (tests/torch/nanogpt_ref.py;
// a tied head is the one tensor transformer.wte.weight). Layer order, as state_dict lists them.
// --format hf: the same tensors as a transformers model directory (model/hf_model.hpp), with the model
// keys taken from the config stored in the checkpoint.
int run_ckpt_export(const CkptOptions& o) {
  CheckpointReader r(o.file);
  std::vector<std::pair<std::string, Shape>> names;
  for (auto& [name, shape] : r.tensors())
    if (name.rfind("model/", 0) == 0) names.emplace_back(name.substr(6), shape);
  auto layer = [](const std::string& n) { return std::isdigit(static_cast<unsigned char>(n[0])) ? std::stoll(n) : -1LL; };
  std::stable_sort(names.begin(), names.end(), [&](const auto& a, const auto& b) { return layer(a.first) < layer(b.first); });
  std::vector<CheckpointTensor> tensors;
  int64_t values = 0;
  for (auto& [name, shape] : names) {
    CheckpointTensor t{name, shape, std::vector<float>(static_cast<size_t>(shape_numel(shape))), nullptr, {}};
    r.read("model/" + name, shape, t.data.data());
    values += shape_numel(shape);
    tensors.push_back(std::move(t));
  }
  const std::map<std::string, std::string> metadata{
      {"format", "pt"}, {"relay_checkpoint", o.file}, {"relay_step", std::to_string(r.meta().step)}};
  if (o.format == "hf") {
    const Config cfg = parse_config_text(r.meta().config_toml, o.file + " (its config)", {});
    // Per-MoE-layer tensors from moe.expert_bias's rows (DeepSeek-V3's e_score_correction_bias), zeros without it.
    const ModelFamily& family = model_family(cfg);
    const std::vector<std::string> bias_names = family.hf_expert_bias_names(cfg.model);
    if (!bias_names.empty()) {
      const int64_t L = int64_t(bias_names.size()), E = family.experts(cfg.model);
      std::vector<float> bias(size_t(L * E), 0.f);  // (MoE layers, E)
      for (auto& [name, shape] : r.tensors()) {
        if (name != "router/expert_bias") continue;
        if (shape != Shape{L, E})
          throw Error(cat(o.file, ": tensor router/expert_bias has shape ", shape_str(shape), " but the model has ", L,
                          " MoE layers of ", E, " experts"));
        r.read(name, shape, bias.data());
      }
      for (int64_t l = 0; l < L; ++l)
        tensors.push_back({bias_names[size_t(l)], {E}, std::vector<float>(bias.begin() + l * E, bias.begin() + (l + 1) * E),
                           nullptr, {}});
    }
    write_hf_dir(o.out, cfg.model, r.meta().tokenizer, std::move(tensors), o.dtype == "bf16", metadata);
    std::printf("wrote %s: config.json, generation_config.json, model.safetensors (%s, %lld values, step %lld of %s) "
                "for transformers' from_pretrained\n",
                o.out.c_str(), o.dtype.c_str(), static_cast<long long>(values), static_cast<long long>(r.meta().step),
                o.file.c_str());
    return 0;
  }
  write_safetensors(o.out, tensors, metadata, o.dtype == "bf16" ? "BF16" : "F32");
  std::printf("wrote %s: %zu tensors, %lld values (step %lld of %s), named as the PyTorch module's state_dict\n",
              o.out.c_str(), tensors.size(), static_cast<long long>(values), static_cast<long long>(r.meta().step),
              o.file.c_str());
  return 0;
}

}  // namespace relay
