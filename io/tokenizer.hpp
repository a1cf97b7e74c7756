// Tokenizers: "bytes" (each byte a token, 256 symbols).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace relay {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// kind "bytes" (vocab and merges unused) or "gpt2" (GPT-2's vocab.json and merges.txt).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab, const std::string& merges);

}  // namespace relay
