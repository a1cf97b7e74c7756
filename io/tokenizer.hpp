// Tokenizers for language-model data: "bytes" (every byte is a token: 256 symbols) and "gpt2",
// GPT-2's byte-level BPE (Radford et al. 2019) read from its standard vocab.json (token string ->
// id) and merges.txt (merge ranks), with the pre-tokenizing regular expression run by PCRE2 in
// Unicode mode. "gpt2" reproduces tiktoken's "gpt2" encoding (tests/torch/test_tiktoken_equivalence.py).
// "hf" reads a byte-level BPE tokenizer.json (io/hf_tokenizer.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace relay {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;       // "bytes" | "gpt2" | "hf"
  virtual int64_t vocab_size() const = 0;     // 256 | 50257 | max id + 1
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;  // plain text, no special tokens
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;   // bytes (UTF-8 when whole)
  // The token that separates documents (GPT-2's <|endoftext|>; for "hf" <|endoftext|> or else
  // <|end_of_text|>), or -1 when there is none.
  virtual int32_t end_of_text() const { return -1; }
};

// The offset of the first byte that does not start a valid UTF-8 sequence, or -1 when all is valid.
int64_t first_invalid_utf8(const std::string& text);

// kind "bytes" (no files), "gpt2" (paths of vocab.json and merges.txt, also known as encoder.json
// and vocab.bpe) or "hf" (path of a tokenizer.json). Errors name the file and what is wrong with it.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab = "",
                                          const std::string& merges = "", const std::string& tokenizer_json = "");

}  // namespace relay
