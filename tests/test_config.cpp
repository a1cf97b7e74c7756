// Config errors name the file and the key; --set overrides; the effective config round-trips.
#include <gtest/gtest.h>

#include "core/config.hpp"
#include "core/error.hpp"
#include "model/families/llama.hpp"
#include "model/families/mlp.hpp"
#include "model/family.hpp"

using namespace relay;

namespace {
const char* kBase = R"(
[model]
layers = [ { type = "linear", out = 8 }, { type = "gelu" }, { type = "linear", out = 3 } ]
[data]
train = "t.h5"
[train]
steps = 10
batch_size = 4
)";

std::string error_of(const std::string& text, const std::vector<std::string>& ov = {}) {
  try {
    parse_config_text(text, "cfg.toml", ov);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, MinimalLoadsWithDefaults) {
  Config c = parse_config_text(kBase, "cfg.toml");
  EXPECT_EQ(c.model.args<MlpArgs>().layers.size(), 3u);
  EXPECT_EQ(c.optimizer.name, "adamw");
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.checkpoint.dir, c.run.dir + "/checkpoints");
}

TEST(Config, CheckpointAsync) {
  EXPECT_FALSE(parse_config_text(kBase, "cfg.toml").checkpoint.async);
  Config c = parse_config_text(kBase, "cfg.toml", {"checkpoint.async=true"});
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_TRUE(parse_config_text(to_toml(c), "effective.toml").checkpoint.async);  // kept by the saved config
  std::string e = error_of(kBase, {"checkpoint.async=\"yes\""});
  EXPECT_NE(e.find("checkpoint.async"), std::string::npos) << e;
}

TEST(Config, UnknownKeyNamesFileAndKey) {
  std::string e = error_of(std::string(kBase) + "[optimizer]\nlearning_rate = 0.1\n");
  EXPECT_NE(e.find("cfg.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.learning_rate"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key"), std::string::npos) << e;
  EXPECT_NE(error_of(std::string(kBase) + "[trian]\n").find("unknown section [trian]"), std::string::npos);
}

TEST(Config, WrongTypeNamesKeyAndTypes) {
  std::string e = error_of(kBase, {"train.steps=\"ten\""});
  EXPECT_NE(e.find("train.steps"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an integer, got string"), std::string::npos) << e;
}

TEST(Config, MissingRequiredKey) {
  std::string e = error_of("[model]\nlayers = [ { type = \"linear\", out = 2 } ]\n[train]\nsteps = 1\nbatch_size = 1\n");
  EXPECT_NE(e.find("data.train"), std::string::npos) << e;
  EXPECT_NE(e.find("required key is missing"), std::string::npos) << e;
}

TEST(Config, BadValues) {
  EXPECT_NE(error_of(kBase, {"train.steps=0"}).find("train.steps: must be in [1"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"optimizer.name=\"adam\""}).find("optimizer.name: must be one of adamw, sgd"),
            std::string::npos);
  EXPECT_NE(error_of(kBase, {"parallel.schedule=\"pipedream\""}).find("parallel.schedule"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"optimizer.betas=[0.9]"}).find("optimizer.betas"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"lr_schedule.warmup_steps=11"}).find("lr_schedule.warmup_steps"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"train.time_limit=\"3 hours\""}).find("train.time_limit"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"train.cpu_bf16_gemm=\"fast\""})
                .find("train.cpu_bf16_gemm: must be one of auto, native, widened"),
            std::string::npos);
  std::string layer = error_of("[model]\nlayers = [ { type = \"linear\" } ]\n[data]\ntrain=\"x\"\n[train]\nsteps=1\nbatch_size=1\n");
  EXPECT_NE(layer.find("model.layers[0].out"), std::string::npos) << layer;
  std::string conv = error_of("[model]\nlayers = [ { type = \"conv\", out = 3 } ]\n[data]\ntrain=\"x\"\n[train]\nsteps=1\nbatch_size=1\n");
  EXPECT_NE(conv.find("model.layers[0].type"), std::string::npos) << conv;
}

TEST(Config, OverridesAndBareStrings) {
  Config c = parse_config_text(kBase, "cfg.toml", {"train.steps=25", "run.dir=runs/x", "parallel.balance=[1, 2]"});
  EXPECT_EQ(c.train.steps, 25);
  EXPECT_EQ(c.run.dir, "runs/x");
  EXPECT_EQ(c.parallel.balance, (std::vector<int64_t>{1, 2}));
  EXPECT_NE(error_of(kBase, {"steps=3"}).find("section.key"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"train.nope=3"}).find("train.nope"), std::string::npos);
}

TEST(Config, EffectiveConfigRoundTrips) {
  Config c = parse_config_text(kBase, "cfg.toml",
                               {"optimizer.lr=0.0123", "parallel.balance=[2, 1]", "train.time_limit=\"1h\"",
                                "train.cpu_bf16_gemm=\"widened\""});
  std::string text = to_toml(c);
  Config d = parse_config_text(text, "effective.toml");
  EXPECT_EQ(to_toml(d), text);
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 0.0123);
  EXPECT_EQ(d.parallel.balance, c.parallel.balance);
  EXPECT_EQ(d.train.cpu_bf16_gemm, "widened");
}

TEST(Config, Durations) {
  EXPECT_DOUBLE_EQ(parse_duration("3h50m", "k"), 3 * 3600 + 50 * 60);
  EXPECT_DOUBLE_EQ(parse_duration("90m", "k"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("45s", "k"), 45);
  EXPECT_DOUBLE_EQ(parse_duration("01:30:00", "k"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("3600", "k"), 3600);
  EXPECT_THROW(parse_duration("3h50", "k"), Error);
  EXPECT_THROW(parse_duration("soon", "k"), Error);
}

// train.precision = "fp8" and its recipe: the default, both spellings, the saved config, and the errors.
TEST(Config, Fp8PrecisionAndRecipe) {
  Config c = parse_config_text(kBase, "cfg.toml", {"train.precision=\"fp8\""});
  EXPECT_EQ(c.train.precision, Precision::fp8);
  EXPECT_EQ(c.train.fp8_recipe, Fp8Recipe::tensorwise);
  EXPECT_EQ(compute_dtype(c.train.precision), DType::bf16);  // activations and working weights as in bf16
  Config b = parse_config_text(kBase, "cfg.toml", {"train.precision=\"fp8\"", "train.fp8_recipe=\"blockwise\""});
  EXPECT_EQ(b.train.fp8_recipe, Fp8Recipe::blockwise);
  Config back = parse_config_text(to_toml(b), "saved.toml");
  EXPECT_EQ(back.train.precision, Precision::fp8);
  EXPECT_EQ(back.train.fp8_recipe, Fp8Recipe::blockwise);
  EXPECT_NE(error_of(kBase, {"train.precision=\"fp8\"", "train.fp8_recipe=\"delayed\""}).find("train.fp8_recipe"),
            std::string::npos);
  const std::string e = error_of(kBase, {"train.precision=\"bf16\"", "train.fp8_recipe=\"tensorwise\""});
  EXPECT_NE(e.find("train.fp8_recipe: = \"tensorwise\" scales FP8 GEMMs and needs train.precision = \"fp8\", got "
                   "train.precision = \"bf16\""), std::string::npos) << e;
  // parallel.fp8_param_gather: ZeRO-3 with tensorwise fp8 only, each refusal naming the key and the one at fault.
  const std::vector<std::string> gather = {"train.precision=\"fp8\"", "optimizer.zero=3", "parallel.dp=2",
                                           "parallel.fp8_param_gather=true"};
  Config g = parse_config_text(kBase, "cfg.toml", gather);
  EXPECT_TRUE(g.parallel.fp8_param_gather);
  EXPECT_TRUE(parse_config_text(to_toml(g), "saved.toml").parallel.fp8_param_gather);
  EXPECT_FALSE(c.parallel.fp8_param_gather);  // the default
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer.zero=1", "parallel.fp8_param_gather: = true gathers ZeRO-3's sharded parameters as FP8 codes and "
                                "needs optimizer.zero = 3, got optimizer.zero = 1"},
           {"train.fp8_recipe=\"blockwise\"", "parallel.fp8_param_gather: = true gathers weights as the tensorwise FP8 "
                                               "GEMMs read them and needs train.precision = \"fp8\" with "
                                               "train.fp8_recipe = \"tensorwise\", got train.precision = \"fp8\", "
                                               "train.fp8_recipe = \"blockwise\""},
           {"train.precision=\"bf16\"", "needs train.precision = \"fp8\" with train.fp8_recipe = \"tensorwise\", got "
                                         "train.precision = \"bf16\""}}) {
    auto ov = gather;
    ov.push_back(set);
    const std::string err = error_of(kBase, ov);
    EXPECT_NE(err.find(expect), std::string::npos) << set << ": " << err;
  }
}

TEST(Config, SkipNonfiniteAndLogSection) {
  Config c = parse_config_text(kBase, "cfg.toml");
  EXPECT_EQ(c.train.skip_nonfinite, 0);  // stop at the first non-finite step, as before the key existed
  EXPECT_FALSE(c.log.tensorboard);
  Config d = parse_config_text(kBase, "cfg.toml", {"train.skip_nonfinite=3", "log.tensorboard=true"});
  EXPECT_EQ(d.train.skip_nonfinite, 3);
  EXPECT_TRUE(d.log.tensorboard);
  Config e = parse_config_text(to_toml(d), "saved.toml");
  EXPECT_EQ(e.train.skip_nonfinite, 3);
  EXPECT_TRUE(e.log.tensorboard);
  EXPECT_NE(error_of(kBase, {"train.skip_nonfinite=-1"}).find("train.skip_nonfinite: must be in [0"), std::string::npos);
  EXPECT_NE(error_of(kBase, {"log.tensorboard=1"}).find("log.tensorboard: expected true or false, got integer"),
            std::string::npos);
  const std::string u = error_of(std::string(kBase) + "[log]\ntensorbord = true\n");
  EXPECT_NE(u.find("log.tensorbord: unknown key (known keys in [log]: tensorboard)"), std::string::npos) << u;
}

// data.document_mask: a language-model key (an MLP has no documents), kept by the effective config.
TEST(Config, DocumentMask) {
  const std::string e = error_of(kBase, {"data.document_mask=true"});
  EXPECT_NE(e.find("data.document_mask"), std::string::npos) << e;
  EXPECT_NE(e.find("needs a language model"), std::string::npos) << e;
  const std::string lm = "[model]\ntype = \"llama\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 2\n"
                         "n_embd = 8\nffn_hidden = 16\n[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 1\n";
  Config c = parse_config_text(lm, "cfg.toml", {"data.document_mask=true", "data.reset_positions=false"});
  EXPECT_TRUE(c.data.document_mask);
  EXPECT_FALSE(c.data.reset_positions);
  Config back = parse_config_text(to_toml(c), "effective.toml");
  EXPECT_TRUE(back.data.document_mask);
  EXPECT_FALSE(back.data.reset_positions);
}

// data.preload: auto, on or off, kept by the effective config; an MLP's key (a language model's batches are ids).
TEST(Config, Preload) {
  EXPECT_EQ(parse_config_text(kBase, "cfg.toml").data.preload, "auto");
  Config c = parse_config_text(kBase, "cfg.toml", {"data.preload=\"on\""});
  EXPECT_EQ(parse_config_text(to_toml(c), "effective.toml").data.preload, "on");
  const std::string bad = error_of(kBase, {"data.preload=\"yes\""});
  EXPECT_NE(bad.find("data.preload: must be one of auto, off, on"), std::string::npos) << bad;
  const std::string lm = "[model]\ntype = \"gpt\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 2\n"
                         "n_embd = 8\n[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 1\n";
  const std::string e = error_of(lm, {"data.preload=\"on\""});
  EXPECT_NE(e.find("data.preload: holds an MLP's feature file"), std::string::npos) << e;
}

TEST(Config, MixtureOfExperts) {
  const std::string moe = "[model]\ntype = \"mixtral\"\nvocab_size = 64\nblock_size = 16\nn_layer = 2\nn_head = 2\n"
                          "n_embd = 8\nn_experts = 4\nexperts_per_token = 2\nmoe_ffn_hidden = 12\n[data]\ntrain = "
                          "\"t.h5\"\n[train]\nsteps = 1\nbatch_size = 1\n";
  Config c = parse_config_text(moe, "cfg.toml");
  EXPECT_TRUE(model_family(c).has_experts() && model_family(c).language_model());
  EXPECT_TRUE(c.model.args<MoeArgs>().norm_topk_prob);  // Mixtral always renormalises
  EXPECT_TRUE(c.model.args<MoeArgs>().moe_layer(0) && c.model.args<MoeArgs>().moe_layer(1));
  Config back = parse_config_text(to_toml(c), "effective.toml");
  EXPECT_EQ(back.model.args<MoeArgs>().n_experts, 4);
  EXPECT_EQ(back.model.args<MoeArgs>().moe_ffn_hidden, 12);
  // Each mistake names its key.
  auto expect_error = [&](const std::vector<std::string>& ov, const std::string& key, const std::string& text,
                          const std::string& base) {
    const std::string e = error_of(base, ov);
    EXPECT_NE(e.find(key), std::string::npos) << e;
    EXPECT_NE(e.find(text), std::string::npos) << e;
  };
  expect_error({"model.experts_per_token=5"}, "model.experts_per_token", "more than model.n_experts = 4", moe);
  expect_error({"model.norm_topk_prob=false"}, "model.norm_topk_prob", "qwen3_moe key", moe);
  expect_error({"model.mlp_only_layers=[0]"}, "model.mlp_only_layers", "qwen3_moe key", moe);
  expect_error({"parallel.tp=2", "model.moe_ffn_hidden=13"}, "parallel.tp", "must divide model.moe_ffn_hidden = 13", moe);
  EXPECT_EQ(parse_config_text(moe, "cfg.toml", {"parallel.cp=2"}).parallel.cp, 2);  // context parallelism too
  // Expert parallelism: ep divides dp and n_experts; every ZeRO stage; only for mixtures of experts.
  expect_error({"parallel.dp=4", "parallel.ep=3"}, "parallel.ep", "must divide parallel.dp = 4", moe);
  expect_error({"parallel.dp=8", "parallel.ep=8"}, "parallel.ep", "must divide model.n_experts = 4", moe);
  for (int zero : {2, 3})
    EXPECT_EQ(parse_config_text(moe, "cfg.toml", {"parallel.dp=4", "parallel.ep=2", cat("optimizer.zero=", zero)})
                  .optimizer.zero, zero);
  expect_error({"parallel.dp=2", "parallel.ep=2"}, "parallel.ep", "needs a mixture of experts", kBase);
  EXPECT_EQ(parse_config_text(moe, "cfg.toml", {"parallel.dp=4", "parallel.ep=2"}).parallel.ep, 2);
  EXPECT_EQ(parse_config_text(to_toml(parse_config_text(moe, "cfg.toml", {"parallel.dp=4", "parallel.ep=4"})),
                              "effective.toml").parallel.ep, 4);
  // Another family's keys, the first in key order named, with the families that have it (from the registry: Mixtral's
  // and Qwen3-MoE's experts_per_token; deepseek_v3 names it num_experts_per_tok).
  expect_error({"model.type=\"llama\"", "model.ffn_hidden=16"}, "model.experts_per_token",
               "mixture-of-experts key; model.type = \"llama\" has no experts (use \"mixtral\" or \"qwen3_moe\")", moe);
  // Qwen3-MoE: dense layers need ffn_hidden; explicit head_dim; mlp_only_layers within the model.
  Config q = parse_config_text(moe, "cfg.toml", {"model.type=\"qwen3_moe\"", "model.head_dim=6",
                                                 "model.decoder_sparse_step=2", "model.ffn_hidden=16"});
  EXPECT_FALSE(q.model.args<MoeArgs>().norm_topk_prob);  // Qwen3MoeConfig's default
  EXPECT_FALSE(q.model.args<MoeArgs>().moe_layer(0));
  EXPECT_TRUE(q.model.args<MoeArgs>().moe_layer(1));
  EXPECT_EQ(q.model.args<MoeArgs>().head_dim, 6);
  expect_error({"model.type=\"qwen3_moe\"", "model.mlp_only_layers=[1]"}, "model.ffn_hidden", "required", moe);
  expect_error({"model.type=\"qwen3_moe\"", "model.mlp_only_layers=[2]"}, "model.mlp_only_layers", "[0, model.n_layer = 2)",
               moe);
  expect_error({"model.type=\"qwen3_moe\"", "model.head_dim=5"}, "model.head_dim", "even head size", moe);
  Config qb = parse_config_text(
      to_toml(parse_config_text(moe, "cfg.toml", {"model.type=\"qwen3_moe\"", "model.mlp_only_layers=[0]",
                                                  "model.ffn_hidden=16", "model.norm_topk_prob=true",
                                                  "model.router_z_loss_coef=0.001"})),
      "effective.toml");
  EXPECT_EQ(qb.model.args<MoeArgs>().mlp_only_layers, std::vector<int64_t>{0});
  EXPECT_TRUE(qb.model.args<MoeArgs>().norm_topk_prob);
  EXPECT_EQ(qb.model.args<MoeArgs>().router_z_loss_coef, 0.001);
  // [moe]: the aux-loss-free expert bias, for mixtures of experts only.
  Config b = parse_config_text(moe, "cfg.toml", {"moe.expert_bias=true", "moe.bias_update_rate=0.01"});
  Config bb = parse_config_text(to_toml(b), "effective.toml");
  EXPECT_TRUE(bb.moe.expert_bias);
  EXPECT_EQ(bb.moe.bias_update_rate, 0.01);
  expect_error({"moe.expert_bias=true"}, "moe.expert_bias", "needs a mixture of experts", kBase);
  expect_error({"moe.bias_update_rate=-1.0"}, "moe.bias_update_rate", "must be in", moe);
}

// deepseek_v3's routed-expert layers are layers [first_k_dense_replace, n_layer): with none, [moe] expert_bias and
// parallel.ep are refused naming the key that made every layer dense; with some, ep must divide n_routed_experts.
TEST(Config, DeepseekV3ExpertLayers) {
  const std::string ds = "[model]\ntype = \"deepseek_v3\"\nvocab_size = 64\nblock_size = 16\nn_layer = 2\nn_head = 2\n"
                         "n_embd = 8\nffn_hidden = 8\nkv_lora_rank = 4\nqk_nope_head_dim = 2\nqk_rope_head_dim = 2\n"
                         "v_head_dim = 2\nn_routed_experts = 4\nnum_experts_per_tok = 2\nn_group = 2\ntopk_group = 1\n"
                         "moe_intermediate_size = 4\n[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 2\n";
  const std::string dense = "model.first_k_dense_replace=2";
  auto has = [](const std::string& e, const std::string& want) {
    EXPECT_NE(e.find(want), std::string::npos) << e << "\nwanted: " << want;
  };
  has(error_of(ds, {dense, "moe.expert_bias=true"}),
      "moe.expert_bias: = true needs MoE layers: model.first_k_dense_replace = 2 >= n_layer = 2 makes every layer dense");
  has(error_of(ds, {dense, "parallel.dp=2", "parallel.ep=2"}), "parallel.ep: = 2 splits experts over ranks and needs "
                                                              "MoE layers: model.first_k_dense_replace = 2");
  has(error_of(ds, {"model.first_k_dense_replace=1", "parallel.dp=8", "parallel.ep=8"}),
      "parallel.ep: = 8 must divide model.n_routed_experts = 4");
  const Config c = parse_config_text(ds, "cfg.toml", {"model.first_k_dense_replace=1", "parallel.dp=2", "parallel.ep=2",
                                                      "moe.expert_bias=true", "model.router_aux_loss_coef=0.01"});
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_TRUE(parse_config_text(to_toml(c), "effective.toml").moe.expert_bias);
  EXPECT_NE(to_toml(c).find("router_aux_loss_coef = 0.01"), std::string::npos) << to_toml(c);
}

// A family owns its [model] keys (src/model/families): another family's key is refused naming the families that have
// it, lists of families in messages are the registry's, and a copied Config holds its own copy of the family's keys.
TEST(Config, FamilyKeysAndListsOfFamilies) {
  const std::string gpt = "[model]\ntype = \"gpt\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 2\n"
                          "n_embd = 8\n[data]\ntrain = \"t.h5\"\n[train]\nsteps = 1\nbatch_size = 1\n";
  auto having = [](const std::string& key) {
    std::vector<const ModelKeys*> owners;
    for (const ModelFamily* f : model_families())
      if (f->keys().count(key)) owners.push_back(f);
    return family_names(owners);
  };
  auto expect_error = [](const std::string& text, const std::vector<std::string>& ov, const std::string& want) {
    const std::string e = error_of(text, ov);
    EXPECT_NE(e.find(want), std::string::npos) << e << "\nwanted: " << want;
  };
  const std::string language_models = family_names(&ModelKeys::language_model);
  for (const ModelFamily* f : model_families())
    EXPECT_EQ(language_models.find(cat("\"", f->name(), "\"")) != std::string::npos, f->language_model()) << f->name();
  EXPECT_EQ(family_names(&ModelKeys::has_experts), "\"mixtral\", \"qwen3_moe\" or \"deepseek_v3\"");
  EXPECT_EQ(family_names({&model_family("llama")}), "\"llama\"");

  expect_error(gpt, {"model.n_kv_head=1"}, cat("model.n_kv_head: is a key of model.type = ", having("n_kv_head"),
                                               ", not of model.type = \"gpt\" (its keys: bias, block_size, "));
  expect_error(gpt, {"model.n_experts=2"}, cat("model.n_experts: is a mixture-of-experts key; model.type = \"gpt\" has "
                                               "no experts (use ", having("n_experts"), ")"));
  expect_error(gpt, {"model.layers=[{ type = \"relu\" }]"},
               "model.layers: is a key of model.type = \"mlp\"; a model.type = \"gpt\" model is given by vocab_size");
  expect_error(kBase, {"model.vocab_size=64"},
               cat("model.vocab_size: is a language-model key; set model.type = ", having("vocab_size"), " to use it"));
  expect_error(kBase, {"parallel.tp=2"}, cat("parallel.tp: = 2 needs model.type = ", language_models, " (tensor "));
  expect_error(kBase, {"parallel.cp=2"}, cat("parallel.cp: = 2 needs model.type = ", language_models, " (context "));
  expect_error(kBase, {"train.recompute=\"blocks\""},
               cat("recomputes transformer blocks and needs model.type = ", language_models));
  expect_error(kBase, {"data.document_mask=true"}, cat("needs a language model (model.type = ", language_models, ")"));
  expect_error(gpt, {"moe.expert_bias=true"},
               cat("needs a mixture of experts (model.type = ", family_names(&ModelKeys::has_experts), ")"));
  // The parallel checks against a family's own keys (check_layout) keep their messages.
  expect_error(gpt, {"model.type=\"llama\"", "model.ffn_hidden=6", "model.n_kv_head=1", "parallel.tp=2"},
               "parallel.tp: = 2 must divide model.n_kv_head = 1 (each tensor-parallel rank holds whole key/value "
               "heads)");
  expect_error(gpt, {"model.type=\"llama\"", "model.ffn_hidden=5", "parallel.tp=2"},
               "parallel.tp: = 2 must divide model.ffn_hidden = 5");

  // The family's keys travel with the Config: a copy holds its own, another family's are an Error naming model.type.
  const Config c = parse_config_text(gpt, "cfg.toml", {"model.type=\"qwen3_moe\"", "model.n_experts=4",
                                                       "model.experts_per_token=2", "model.moe_ffn_hidden=6"});
  Config d = c;
  d.model.edit_args<MoeArgs>().n_experts = 8;
  EXPECT_EQ(c.model.args<MoeArgs>().n_experts, 4);
  EXPECT_EQ(d.model.args<LlamaArgs>().n_kv_head, 2);  // the decoder's keys, through the struct MoeArgs derives from
  d = c;
  EXPECT_EQ(d.model.args<MoeArgs>().n_experts, 4);
  EXPECT_EQ(model_family(c).experts(c.model), 4);
  const Config g = parse_config_text(gpt, "cfg.toml");
  try {
    (void)g.model.args<LlamaArgs>();
    ADD_FAILURE() << "a GPT's keys read as Llama's";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.type = \"gpt\""), std::string::npos) << e.what();
  }
  EXPECT_EQ(Config().model.args<LlamaArgs>().rope_theta, 10000.0);  // a Config made in code: the defaults
}
