// relay data synth | tokenize | inspect
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "cli/commands.hpp"
#include "io/corpus.hpp"
#include "io/inspect.hpp"
#include "io/synth.hpp"
#include "io/token_dataset.hpp"
#include "io/tokenizer.hpp"
#include "model/family.hpp"

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
  auto* t = d->add_subcommand("tokenize", cat("Turn a corpus (JSON Lines or text, plain or .zst) into a token file "
                                               "for a language model (model.type = ",
                                               family_names(&ModelKeys::language_model), ")"));
  t->add_option("--in", o.inputs, "Input files, read in order; a name ending in .zst is zstd-compressed")
      ->required()->expected(1, -1);
  t->add_option("--format", o.format, "jsonl: one JSON object per line, the document in --field; text: UTF-8 text")
      ->check(CLI::IsMember({"text", "jsonl"}))->capture_default_str();
  t->add_option("--field", o.field, "jsonl: the string field that holds the document")->capture_default_str();
  t->add_option("--doc-separator", o.doc_separator,
                "text: what separates documents in a file: blank-line, or a literal string (\\n for a newline); "
                "unset: one document per file");
  t->add_option("--on-bad-record", o.on_bad_record,
                "a record with invalid JSON, no string --field or invalid UTF-8: error (stop, naming its file and line) "
                "or skip (count it, name the first few)")
      ->check(CLI::IsMember({"error", "skip"}))->capture_default_str();
  t->add_option("--eot-id", o.eot_id, "the token written between documents (default: the tokenizer's end-of-text token)")
      ->check(CLI::NonNegativeNumber);
  t->add_option("--workers", o.workers, "threads that parse and tokenize (default: every core); the output is the "
                                         "same for any number")
      ->check(CLI::PositiveNumber);
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

namespace {

// The progress of a tokenization on stderr: a line every 2 s (rewritten in place on a terminal), and the last.
class TokenizeProgress {
 public:
  explicit TokenizeProgress(uint64_t total_bytes) : total_(total_bytes), tty_(isatty(2)) {}
  void update(uint64_t bytes, int64_t docs, size_t tokens, bool last = false) {
    const double now = seconds();
    if (!last && now - shown_ < 2.0) return;
    shown_ = now;
    const double rate = double(bytes) / std::max(now - start_, 1e-9);  // input bytes per second
    const double eta = rate > 0 ? double(total_ - std::min(bytes, total_)) / rate : 0.0;
    std::fprintf(stderr, "%stokenize: %.1f of %.1f MB (%.1f MB/s), %lld documents, %zu tokens, %s %.0f s%s",
                 tty_ ? "\r" : "", double(bytes) / 1e6, double(total_) / 1e6, rate / 1e6, static_cast<long long>(docs),
                 tokens, last ? "took" : "ETA", last ? now - start_ : eta, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  static double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  uint64_t total_;
  bool tty_;
  double start_ = seconds(), shown_ = seconds();
};

}  // namespace

// Records are read in order by this thread in batches of about 8 MB; each batch's records are parsed, checked
// and tokenized by --workers threads (contiguous ranges of the batch), then appended in input order, so the
// output does not depend on the number of workers.
int run_data_tokenize(const DataOptions& o) {
  if ((o.eval_fraction > 0) != !o.eval_out.empty())
    throw Error("--eval-fraction and --eval-out go together (the evaluation split needs both)");
  auto tok = make_tokenizer(o.tokenizer, o.vocab, o.merges, o.tokenizer_json);
  // Documents are separated by the end-of-text token where the vocabulary has one (gpt2, hf), as GPT-2's
  // training data and nanoGPT's preparation scripts do; the bytes tokenizer has none unless --eot-id names one.
  const int64_t eot = o.eot_id >= 0 ? o.eot_id : tok->end_of_text();
  if (eot >= tok->vocab_size())
    throw Error(cat("--eot-id ", eot, " is not below the ", tok->name(), " tokenizer's vocabulary of ", tok->vocab_size()));
  const CorpusOptions co{o.format, o.field, o.doc_separator};
  CorpusReader reader(o.inputs, co);
  const int workers = o.workers > 0 ? o.workers : std::max(1, int(std::thread::hardware_concurrency()));
  const bool check_utf8 = tok->name() != "bytes";
  std::vector<int32_t> ids;
  int64_t docs = 0, bad = 0;
  std::vector<std::string> bad_examples;  // the first few skipped records
  TokenizeProgress progress(reader.total_bytes());
  std::vector<RawRecord> batch;
  while (batch.clear(), reader.next_batch(batch, size_t(8) << 20)) {
    std::vector<std::vector<int32_t>> encoded(batch.size());
    std::vector<std::string> errors(batch.size());
    auto work = [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        ParsedRecord p = parse_record(batch[i], co, check_utf8);
        if (p.error.empty()) encoded[i] = tok->encode(p.text);
        else errors[i] = std::move(p.error);
      }
    };
    const size_t n = batch.size(), w = std::min<size_t>(size_t(workers), n);
    std::vector<std::thread> threads;
    for (size_t k = 1; k < w; ++k) threads.emplace_back(work, k * n / w, (k + 1) * n / w);
    std::exception_ptr failed;
    try {
      work(0, n / w);
    } catch (...) {
      failed = std::current_exception();
    }
    for (std::thread& th : threads) th.join();
    if (failed) std::rethrow_exception(failed);
    for (size_t i = 0; i < n; ++i) {
      if (!errors[i].empty()) {
        const std::string where = cat(reader.paths()[size_t(batch[i].file)], " line ", batch[i].line);
        if (o.on_bad_record == "error")
          throw Error(cat("--in ", where, ": ", errors[i], " (--on-bad-record skip drops such records and counts them)"));
        ++bad;
        if (bad_examples.size() < 5) bad_examples.push_back(cat(where, ": ", errors[i]));
        continue;
      }
      if (docs > 0 && eot >= 0) ids.push_back(int32_t(eot));
      ids.insert(ids.end(), encoded[i].begin(), encoded[i].end());
      ++docs;
    }
    progress.update(reader.bytes_read(), docs, ids.size());
  }
  progress.update(reader.bytes_read(), docs, ids.size(), true);
  if (bad > 0) {
    std::fprintf(stderr, "tokenize: skipped %lld bad record%s (--on-bad-record skip), the first:\n", static_cast<long long>(bad),
                 bad == 1 ? "" : "s");
    for (const std::string& b : bad_examples) std::fprintf(stderr, "  %s\n", b.c_str());
  }
  if (docs == 0) throw Error(cat("--in: no documents in ", o.inputs.size(), " file(s)", bad > 0 ? " (every record was bad)" : ""));
  const size_t n_eval = static_cast<size_t>(double(ids.size()) * o.eval_fraction);
  std::vector<int32_t> train(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(n_eval));
  // documents: those with a token in the file (a document cut by the evaluation split counts in both).
  auto documents_in = [&](const std::vector<int32_t>& part, bool first) {
    if (eot < 0) return first ? docs : int64_t(0);
    if (part.empty()) return int64_t(0);
    // Every end-of-text token ends a document and the next starts after it; the train file's first document
    // starts at its beginning, the evaluation file's first one before it unless the file starts with the token.
    const int64_t eots = int64_t(std::count(part.begin(), part.end(), int32_t(eot)));
    return eots + (part.back() == eot ? 0 : 1);
  };
  write_token_file(o.out, train, tok->vocab_size(), tok->name(), {{"eot_id", eot}, {"documents", documents_in(train, true)}});
  std::printf("wrote %s: %zu tokens, %lld documents (tokenizer %s, vocab_size %lld, end-of-text %lld)%s\n", o.out.c_str(),
              train.size(), static_cast<long long>(documents_in(train, true)), tok->name().c_str(),
              static_cast<long long>(tok->vocab_size()), static_cast<long long>(eot),
              bad > 0 ? cat(", ", bad, " bad records skipped").c_str() : "");
  if (n_eval > 0) {
    std::vector<int32_t> eval(ids.end() - static_cast<std::ptrdiff_t>(n_eval), ids.end());
    write_token_file(o.eval_out, eval, tok->vocab_size(), tok->name(), {{"eot_id", eot}, {"documents", documents_in(eval, false)}});
    std::printf("wrote %s: %zu tokens (the last %.4g of the text)\n", o.eval_out.c_str(), eval.size(), o.eval_fraction);
  }
  return 0;
}

int run_data_inspect(const DataOptions& o) {
  std::printf("%s", inspect_dataset(o.file).c_str());
  return 0;
}

}  // namespace relay
