// relay data synth | tokenize | inspect
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/commands.hpp"
#include "io/inspect.hpp"
#include "io/synth.hpp"
#include "io/token_dataset.hpp"
#include "io/tokenizer.hpp"

namespace relay {

CLI::App* add_data_command(CLI::App& app, DataOptions& o, CLI::App** synth, CLI::App** inspect, CLI::App** tokenize) {
  auto* d = app.add_subcommand("data", "Make or check HDF5 datasets");
  d->require_subcommand(1);
  auto* s = d->add_subcommand("synth", "Write a learnable synthetic classification set (labels from a fixed random teacher MLP)");
  s->add_option("--out", o.out, "Output HDF5 file")->required();
  s->add_option("--samples", o.samples, "Number of samples N")->required();
  s->add_option("--features", o.features, "Input features D")->required();
  s->add_option("--classes", o.classes, "Number of classes C")->required();
  s->add_option("--seed", o.seed, "Seed of the samples")->required();
  s->add_option("--teacher-seed", o.teacher_seed, "Seed of the teacher network (train and eval sets share it)")
      ->capture_default_str();
  auto* t = d->add_subcommand("tokenize", "Turn text files into a token file for a language model (model.type = \"gpt\" or \"llama\")");
  t->add_option("--in", o.inputs, "Text files (UTF-8), concatenated in order")->required()->expected(1, -1);
  t->add_option("--out", o.out, "Output token file (HDF5)")->required();
  t->add_option("--tokenizer", o.tokenizer, "bytes | gpt2 | hf")->required()->check(CLI::IsMember({"bytes", "gpt2", "hf"}));
  t->add_option("--vocab", o.vocab, "gpt2: GPT-2's vocab.json (encoder.json)");
  t->add_option("--merges", o.merges, "gpt2: GPT-2's merges.txt (vocab.bpe)");
  t->add_option("--tokenizer-json", o.tokenizer_json,
                "hf: a Hugging Face tokenizer.json (byte-level BPE: GPT-2's, Llama 3's, SmolLM's); documents are "
                "separated by its <|endoftext|> token, else its <|end_of_text|>; no BOS is added");
  t->add_option("--eval-fraction", o.eval_fraction, "Put the last fraction F of the tokens into --eval-out")
      ->check(CLI::Range(0.0, 0.9));
  t->add_option("--eval-out", o.eval_out, "Output token file of the evaluation split");
  auto* i = d->add_subcommand("inspect", "Validate a dataset and print its datasets, shapes and dtypes");
  i->add_option("file", o.file, "HDF5 file")->required();
  *synth = s;
  *inspect = i;
  *tokenize = t;
  return d;
}

int run_data_synth(const DataOptions& o) {
  write_synthetic_classification(o.out, o.samples, o.features, o.classes, o.seed, o.teacher_seed);
  std::printf("wrote %s: %lld samples, %lld features, %lld classes (seed %llu, teacher seed %llu)\n", o.out.c_str(),
              static_cast<long long>(o.samples), static_cast<long long>(o.features), static_cast<long long>(o.classes),
              static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.teacher_seed));
  return 0;
}

int run_data_tokenize(const DataOptions& o) {
  if ((o.eval_fraction > 0) != !o.eval_out.empty())
    throw Error("--eval-fraction and --eval-out go together (the evaluation split needs both)");
  auto tok = make_tokenizer(o.tokenizer, o.vocab, o.merges, o.tokenizer_json);
  std::vector<int32_t> ids;
  for (size_t k = 0; k < o.inputs.size(); ++k) {
    const std::string& path = o.inputs[k];
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(cat("--in ", path, ": cannot open the file"));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (o.tokenizer != "bytes") {
      const int64_t bad = first_invalid_utf8(text);
      if (bad >= 0)
        throw Error(cat("--in ", path, ": not valid UTF-8 at byte ", bad, " (the ", o.tokenizer, " tokenizer reads UTF-8 text)"));
    }
    // Documents are separated by the end-of-text token where the vocabulary has one (gpt2, hf), as
    // GPT-2's training data and nanoGPT's preparation scripts do.
    if (k > 0 && tok->end_of_text() >= 0) ids.push_back(tok->end_of_text());
    auto part = tok->encode(text);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  const size_t n_eval = static_cast<size_t>(double(ids.size()) * o.eval_fraction);
  std::vector<int32_t> train(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(n_eval));
  write_token_file(o.out, train, tok->vocab_size(), tok->name());
  std::printf("wrote %s: %zu tokens (tokenizer %s, vocab_size %lld) from %zu file%s\n", o.out.c_str(), train.size(),
              tok->name().c_str(), static_cast<long long>(tok->vocab_size()), o.inputs.size(),
              o.inputs.size() == 1 ? "" : "s");
  if (n_eval > 0) {
    std::vector<int32_t> eval(ids.end() - static_cast<std::ptrdiff_t>(n_eval), ids.end());
    write_token_file(o.eval_out, eval, tok->vocab_size(), tok->name());
    std::printf("wrote %s: %zu tokens (the last %.4g of the text)\n", o.eval_out.c_str(), eval.size(), o.eval_fraction);
  }
  return 0;
}

int run_data_inspect(const DataOptions& o) {
  std::printf("%s", inspect_dataset(o.file).c_str());
  return 0;
}

}  // namespace relay
