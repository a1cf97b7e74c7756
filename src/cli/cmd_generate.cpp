// relay generate --checkpoint FILE (--prompt TEXT | --prompt-tokens FILE) --max-new-tokens N
//   [--temperature T --top-k K --seed S] [--tokenizer-files vocab.json merges.txt | --tokenizer-json FILE]
//   [--device cpu|cuda] [--tokens-out FILE] [--logits-out FILE]
// Text from a language model's checkpoint on one rank with a key-value cache (model/generate.hpp). The
// checkpoint names its tokenizer; "gpt2" needs GPT-2's vocab.json and merges.txt, "hf" the
// tokenizer.json the data was made with, to encode a text prompt and to print text. After the text, one line: the
// caches' bytes per token and for the run (DeepSeek-V3: MLA's compressed cache, beside a standard cache of its heads).
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "backend/backend.hpp"
#include "cli/commands.hpp"
#include "io/checkpoint.hpp"
#include "io/tokenizer.hpp"
#include "model/family.hpp"
#include "model/generate.hpp"
#include "model/model_spec.hpp"

namespace relay {

CLI::App* add_generate_command(CLI::App& app, GenerateOptions& o) {
  auto* c = app.add_subcommand("generate", "Generate text from a language model's checkpoint (one rank, CPU or GPU)");
  c->add_option("--checkpoint", o.checkpoint,
                cat("Checkpoint file (step_XXXXXXXX.h5) of a language model run (model.type = ",
                    family_names(&ModelKeys::language_model), ")"))
      ->required();
  auto* p = c->add_option("--prompt", o.prompt, "Prompt text");
  auto* pt = c->add_option("--prompt-tokens", o.prompt_tokens, "File of whitespace-separated prompt token ids");
  p->excludes(pt);
  c->add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate")->required()->check(CLI::Range(0, 1 << 24));
  c->add_option("--temperature", o.temperature, "Sampling temperature; 0 = greedy (argmax)")->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", o.top_k, "Sample from the k most likely tokens; 0 = all")->check(CLI::Range(0, 1 << 30));
  c->add_option("--seed", o.seed, "Random seed: the same seed gives the same text");
  c->add_option("--tokenizer-files", o.tokenizer_files, "GPT-2's vocab.json and merges.txt (tokenizer \"gpt2\")")
      ->expected(2);
  c->add_option("--tokenizer-json", o.tokenizer_json, "The tokenizer.json of the training data (tokenizer \"hf\")");
  c->add_option("--device", o.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--precision", o.precision, "fp32 | bf16 | tf32 (default: the run's train.precision)")
      ->check(CLI::IsMember({"fp32", "bf16", "tf32"}));
  c->add_option("--tokens-out", o.tokens_out, "Also write prompt + generated token ids here (one line)");
  c->add_option("--logits-out", o.logits_out,
                "Also write the logits each new token was drawn from here: one line of vocab_size floats per token");
  return c;
}

namespace {

std::vector<int32_t> read_token_ids(const std::string& path, int64_t vocab) {
  std::ifstream f(path);
  if (!f) throw Error(cat("--prompt-tokens ", path, ": cannot open the file"));
  std::vector<int32_t> ids;
  std::string word;
  while (f >> word) {
    char* end = nullptr;
    long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v >= vocab)
      throw Error(cat("--prompt-tokens ", path, ": token ", ids.size(), " is \"", word, "\"; expected an integer in [0, ",
                      vocab, ") (model.vocab_size)"));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error(cat("--prompt-tokens ", path, ": the file holds no token ids"));
  return ids;
}

}  // namespace

int run_generate_command(const GenerateOptions& o) {
  CheckpointReader reader(o.checkpoint);
  // One rank: whole blocks, no sequence parallelism, whatever layout trained it.
  std::vector<std::string> overrides = {"parallel.sequence_parallel=false"};
  if (!o.precision.empty()) overrides.push_back("train.precision=\"" + o.precision + "\"");
  const Config cfg = parse_config_text(reader.meta().config_toml, o.checkpoint + " (its config)", overrides);
  const ModelSpec model = make_model_spec(cfg, 0);
  if (!model.language_model)
    throw Error(cat("--checkpoint ", o.checkpoint, " holds a model.type = \"", cfg.model.type,
                    "\" model; relay generate needs a language model's checkpoint (model.type = ",
                    family_names(&ModelKeys::language_model), ")"));
  const std::string kind = reader.meta().tokenizer.empty() ? "bytes" : reader.meta().tokenizer;
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer_json.empty() && kind != "hf")
    throw Error(cat("--tokenizer-json: the checkpoint was trained on \"", kind, "\" tokens, not on a tokenizer.json's (\"hf\")"));
  if (!o.tokenizer_files.empty() && kind == "hf")
    throw Error(cat("--tokenizer-files: the checkpoint was trained on \"", kind, "\" tokens, not on GPT-2's (\"gpt2\")"));
  if (kind == "bytes") tok = make_tokenizer("bytes", "", "");
  else if (kind == "hf" && !o.tokenizer_json.empty()) tok = make_tokenizer("hf", "", "", o.tokenizer_json);
  else if (kind == "gpt2" && o.tokenizer_files.size() == 2)
    tok = make_tokenizer(kind, o.tokenizer_files[0], o.tokenizer_files[1]);
  // What to pass to print text, for the messages below.
  const std::string files = kind == "hf" ? "--tokenizer-json FILE" : "--tokenizer-files vocab.json merges.txt";
  std::vector<int32_t> prompt;
  if (!o.prompt_tokens.empty()) {
    prompt = read_token_ids(o.prompt_tokens, cfg.model.vocab_size);
  } else {
    if (o.prompt.empty()) throw Error("relay generate needs --prompt TEXT or --prompt-tokens FILE");
    if (!tok)
      throw Error(cat("the checkpoint was trained on \"", kind, "\" tokens; --prompt needs ", files,
                      " (or give --prompt-tokens)"));
    prompt = tok->encode(o.prompt);
    for (int32_t t : prompt)
      if (t >= cfg.model.vocab_size)
        throw Error(cat("--prompt encodes to token ", t, " but the model's vocab_size is ", cfg.model.vocab_size));
  }

  BackendOptions bo;
  bo.device = o.device == "cuda" ? Device::cuda : Device::cpu;
  bo.threads = std::max(1u, std::thread::hardware_concurrency());
  bo.precision = cfg.train.precision;
  bo.cpu_bf16_gemm = cfg.train.cpu_bf16_gemm;
  auto be = make_backend(bo);
  ParamStore store(*be, cfg.model.seed, 1, 0, compute_dtype(cfg.train.precision));
  std::vector<float> buf;
  for (const BlockSpec& b : model.blocks)
    for (const ParamSpec& p : b.params) {
      if (store.find(p.name)) continue;
      Param* param = store.get(p);
      buf.resize(static_cast<size_t>(shape_numel(p.shape)));
      reader.read("model/" + p.name, p.shape, buf.data());
      be->upload(param->value, buf.data());
      param->refresh_work(*be);
    }
  Generator gen(*be, cfg, store);
  if (cfg.moe.expert_bias) {  // the routers' top-k choice as training left it
    for (auto& [name, shape] : reader.tensors())
      if (name == "router/expert_bias") {
        std::vector<float> bias(static_cast<size_t>(shape_numel(shape)));
        reader.read(name, shape, bias.data());
        gen.set_expert_bias(bias);
      }
  }
  SamplingOptions so;
  so.max_new_tokens = o.max_new_tokens;
  so.temperature = o.temperature;
  so.top_k = o.top_k;
  so.seed = o.seed;
  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> out = gen.generate(prompt, so, o.logits_out.empty() ? nullptr : &logits);
  if (!o.logits_out.empty()) {
    std::ofstream f(o.logits_out, std::ios::trunc);
    if (!f) throw Error(cat("--logits-out ", o.logits_out, ": cannot write the file"));
    char buf[32];
    for (const auto& row : logits) {
      for (size_t i = 0; i < row.size(); ++i) {
        std::snprintf(buf, sizeof buf, "%s%.9g", i ? " " : "", double(row[i]));  // round-trips a float
        f << buf;
      }
      f << "\n";
    }
  }
  if (!o.tokens_out.empty()) {
    std::ofstream f(o.tokens_out, std::ios::trunc);
    if (!f) throw Error(cat("--tokens-out ", o.tokens_out, ": cannot write the file"));
    for (size_t i = 0; i < out.size(); ++i) f << (i ? " " : "") << out[i];
    f << "\n";
  }
  // The caches' size: bytes per token over the layers, and for the tokens this run held; beside it what a standard
  // key-value cache of the same heads would take (the same figure for GPT and Llama; MLA keeps a latent instead).
  const Generator::CacheSize cs = gen.cache_size();
  const int64_t held = gen.cached_positions(), per_value = int64_t(dtype_size(compute_dtype(cfg.train.precision)));
  std::ostringstream line;
  line << "cache: " << cs.bytes << " bytes per token";
  if (!cs.values.empty()) line << " = " << cs.layers << " layers x " << cs.values << " values x " << per_value << " bytes";
  line << "; " << cs.bytes * held << " bytes for the " << held << " tokens of this run";
  if (cs.standard_bytes != cs.bytes)
    line << "; a standard key-value cache of the same heads: " << cs.standard_bytes << " bytes per token, "
         << cs.standard_bytes * held << " bytes (" << std::fixed << std::setprecision(1)
         << double(cs.standard_bytes) / double(cs.bytes) << "x)";
  if (tok) {
    const std::string text = tok->decode(out);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n(token ids: pass %s to print text)\n", files.c_str());
  }
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace relay
