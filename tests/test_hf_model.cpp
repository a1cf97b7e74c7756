// Hugging Face model directories (model/hf_model.hpp) without transformers: a written directory reads back
// with the same tensors (GPT-2's Conv1D weights transposed on disk and back), config.json matches the
// [model] it was written from, and every difference, another model_type, a missing tensor and a GPT
// without biases are errors naming the key and both values. Llama and GPT-2 both.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/error.hpp"
#include "model/family.hpp"
#include "model/hf_model.hpp"

using namespace relay;
namespace fs = std::filesystem;

namespace {

// [model] as the parser reads it from these keys and --set overrides.
Config::Model parse_model(const std::string& keys, const std::vector<std::string>& overrides) {
  return parse_config_text("[model]\n" + keys + "[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 1\n",
                           "cfg.toml", overrides)
      .model;
}

Config::Model llama(const std::vector<std::string>& overrides = {}) {
  return parse_model("type = \"llama\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 4\nn_kv_head = 2\n"
                     "n_embd = 32\nffn_hidden = 48\ntie_embeddings = false\nnorm_eps = 1e-5\nrope_theta = 500000.0\n",
                     overrides);
}

Config::Model gpt2(const std::vector<std::string>& overrides = {}) {
  return parse_model("type = \"gpt\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 4\nn_embd = 32\n",
                     overrides);
}

CheckpointTensor tensor(const std::string& name, Shape shape) {
  CheckpointTensor t{name, shape, std::vector<float>(static_cast<size_t>(shape_numel(shape))), nullptr, {}};
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = float(i) * 0.25f - float(name.size());  // distinct per tensor
  return t;
}

std::vector<CheckpointTensor> llama_tensors() {
  return {tensor("model.embed_tokens.weight", {64, 32}), tensor("model.layers.0.input_layernorm.weight", {32}),
          tensor("model.layers.0.self_attn.q_proj.weight", {32, 32}),
          tensor("model.layers.0.self_attn.k_proj.weight", {16, 32}),
          tensor("model.layers.0.self_attn.v_proj.weight", {16, 32}),
          tensor("model.layers.0.self_attn.o_proj.weight", {32, 32}),
          tensor("model.layers.0.post_attention_layernorm.weight", {32}),
          tensor("model.layers.0.mlp.gate_proj.weight", {48, 32}), tensor("model.layers.0.mlp.up_proj.weight", {48, 32}),
          tensor("model.layers.0.mlp.down_proj.weight", {32, 48}), tensor("model.norm.weight", {32}),
          tensor("lm_head.weight", {64, 32})};
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("relay_hf_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::remove_all(path); fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void patch_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  edit(c);
  std::ofstream(dir / "config.json") << c.dump();
}

}  // namespace

TEST(HfModel, LlamaDirectoryRoundTrips) {
  TempDir t;
  const std::string dir = (t.path / "out").string();
  write_hf_dir(dir, llama(), "bytes", llama_tensors(), false, {});
  auto c = nlohmann::json::parse(std::ifstream(fs::path(dir) / "config.json"));
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_EQ(c["rope_parameters"]["rope_theta"], 500000.0);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "generation_config.json"));
  HfModelDir d(dir, "init");
  d.check_matches(llama());
  for (auto& want : llama_tensors()) {
    ASSERT_EQ(d.tensors().at(want.name), want.shape) << want.name;
    std::vector<float> got(want.data.size());
    d.read(want.name, want.shape, got.data());
    EXPECT_EQ(got, want.data) << want.name;
  }
}

TEST(HfModel, LlamaKeyDifferencesNameBothValues) {
  TempDir t;
  const std::string dir = (t.path / "out").string();
  write_hf_dir(dir, llama(), "bytes", llama_tensors(), false, {});
  HfModelDir d(dir, "model.init_from = \"D\"");
  Config::Model m = llama({"model.n_kv_head=4"});
  EXPECT_EQ(error_of([&] { d.check_matches(m); }),
            "model.init_from = \"D\": config.json num_key_value_heads = 2 but model.n_kv_head = 4");
  m = llama({"model.rope_theta=10000.0"});
  EXPECT_NE(error_of([&] { d.check_matches(m); }).find("rope_theta = 500000.0 but model.rope_theta = 10000.0"),
            std::string::npos);
  m = llama();
  m.block_size = 32;  // longer than max_position_embeddings 16
  EXPECT_NE(error_of([&] { d.check_matches(m); }).find("max_position_embeddings = 16"), std::string::npos);
  m = llama();
  m.block_size = 8;  // shorter: rotary embeddings need no more
  EXPECT_EQ(error_of([&] { d.check_matches(m); }), "");
  EXPECT_NE(error_of([&] { d.check_matches(gpt2()); }).find("config.json has model_type \"llama\" (architectures "
                                                              "[\"LlamaForCausalLM\"]) but model.type = \"gpt\""),
            std::string::npos);
  patch_config(dir, [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}}; });
  EXPECT_NE(error_of([&] { HfModelDir(dir, "x").check_matches(llama()); }).find("rope_scaling"), std::string::npos);
  patch_config(dir, [](nlohmann::json& c) { c.erase("rope_scaling"); c["attention_bias"] = true; });
  EXPECT_NE(error_of([&] { HfModelDir(dir, "x").check_matches(llama()); }).find("attention_bias = true"),
            std::string::npos);
}

TEST(HfModel, Gpt2Conv1dWeightsAreStoredTransposed) {
  TempDir t;
  const std::string dir = (t.path / "out").string();
  std::vector<CheckpointTensor> ts = {tensor("transformer.wte.weight", {64, 32}),
                                      tensor("transformer.h.0.attn.c_attn.weight", {96, 32}),
                                      tensor("transformer.h.0.attn.c_attn.bias", {96}),
                                      tensor("transformer.h.0.mlp.c_proj.weight", {32, 128})};
  write_hf_dir(dir, gpt2(), "bytes", ts, false, {});
  SafetensorsFile raw((fs::path(dir) / "model.safetensors").string());
  EXPECT_EQ(raw.find("transformer.h.0.attn.c_attn.weight")->shape, (Shape{32, 96}));
  EXPECT_EQ(raw.find("transformer.h.0.mlp.c_proj.weight")->shape, (Shape{128, 32}));
  EXPECT_EQ(raw.find("transformer.wte.weight")->shape, (Shape{64, 32}));
  std::vector<float> on_disk(96 * 32);
  raw.read("transformer.h.0.attn.c_attn.weight", {32, 96}, on_disk.data());
  EXPECT_EQ(on_disk[1 * 96 + 5], ts[1].data[5 * 32 + 1]);  // [in 1, out 5] = Relay's [out 5, in 1]
  HfModelDir d(dir, "init");
  d.check_matches(gpt2());
  for (auto& want : ts) {
    std::vector<float> got(want.data.size());
    d.read(want.name, want.shape, got.data());
    EXPECT_EQ(got, want.data) << want.name;
  }
}

TEST(HfModel, Bf16RoundsToNearestEven) {
  TempDir t;
  const std::string dir = (t.path / "out").string();
  CheckpointTensor w{"transformer.wte.weight", {1, 3}, {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f}};
  write_hf_dir(dir, gpt2(), "bytes", {w}, true, {});
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(fs::path(dir) / "config.json"))["dtype"], "bfloat16");
  SafetensorsFile raw((fs::path(dir) / "model.safetensors").string());
  EXPECT_EQ(raw.find(w.name)->dtype, "BF16");
  std::vector<float> got(3);
  raw.read(w.name, {1, 3}, got.data());
  EXPECT_EQ(got, (std::vector<float>{1.0f, 1.0f + 4.0f / 256, -2.5f}));  // ties to the even mantissa
}

TEST(HfModel, BadInputIsNamed) {
  TempDir t;
  Config::Model m = gpt2({"model.bias=false"});
  const std::string out = (t.path / "nobias").string();
  EXPECT_NE(error_of([&] { write_hf_dir(out, m, "bytes", {}, false, {}); }).find("model.bias = false"), std::string::npos);
  EXPECT_FALSE(fs::exists(out));
  Config::Model mlp;
  EXPECT_NE(error_of([&] { write_hf_dir(out, mlp, "", {}, false, {}); }).find("model.type = \"mlp\""), std::string::npos);
  EXPECT_NE(error_of([&] { HfModelDir(t.path.string(), "init"); }).find("no config.json"), std::string::npos);
  std::ofstream(t.path / "config.json") << R"({"model_type": "gpt2"})";
  EXPECT_NE(error_of([&] { HfModelDir(t.path.string(), "init"); }).find("neither model.safetensors"), std::string::npos);
  std::ofstream(t.path / "model.safetensors.index.json") << R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})";
  EXPECT_NE(error_of([&] { HfModelDir(t.path.string(), "init"); }).find("model-00001-of-00002.safetensors"),
            std::string::npos);
  write_hf_dir((t.path / "ok").string(), gpt2(), "bytes", {tensor("transformer.wte.weight", {64, 32})}, false, {});
  HfModelDir d((t.path / "ok").string(), "init");
  std::vector<float> buf(64 * 32);
  EXPECT_NE(error_of([&] { d.read("transformer.wpe.weight", {16, 32}, buf.data()); }).find("missing from the directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { write_hf_dir((t.path / "ok").string(), gpt2(), "bytes", {}, false, {}); })
                .find("not an empty directory"),
            std::string::npos);
}
