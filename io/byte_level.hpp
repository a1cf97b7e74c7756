// What GPT-2-style byte-level BPE tokenizers share (GPT-2's encoder.py, Hugging Face's ByteLevel
// pre-tokenizer): the byte -> printable-character alphabet, and the pre-tokenizing regular
// expressions run by PCRE2 in Unicode mode, which split text into the pieces BPE merges within.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace relay {

// UTF-8 of one code point.
std::string utf8_char(uint32_t cp);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100 onwards.
const std::array<std::string, 256>& byte_level_alphabet();

// The pre-tokenizer patterns, spelled for PCRE2. \s is written out as Unicode's White_Space
// property, which tiktoken's and tokenizers' regex engines use: PCRE2's own \s also matches U+180E.
// \p{L} and \p{N} are replaced by generated tables when compiled (io/unicode_classes.hpp).
extern const char* const kGpt2PatternPcre2;    // GPT-2's pattern
extern const char* const kLlama3PatternPcre2;  // Llama 3's (SmolLM2's) pattern
// The same patterns as tokenizer.json files spell them (Split's "Regex"), to recognise them.
extern const char* const kGpt2PatternHf;
extern const char* const kLlama3PatternHf;

// A compiled pre-tokenizer pattern. split() gives the byte spans [begin, end) of `text` in order,
// every match and every gap between matches (tokenizers' "Isolated" behaviour), covering the text.
// `text` must be valid UTF-8 (checked by the caller once, not on every match).
class PretokenRegex {
 public:
  explicit PretokenRegex(const char* pattern);
  ~PretokenRegex();
  PretokenRegex(const PretokenRegex&) = delete;
  PretokenRegex& operator=(const PretokenRegex&) = delete;
  void split(const std::string& text, std::vector<std::pair<size_t, size_t>>& spans) const;

 private:
  pcre2_real_code_8* re_ = nullptr;
};

// Byte-level BPE over token ids, the one merge loop of GPT-2's tokenizer (vocab.json + merges.txt) and
// tokenizer.json's: a pre-token's bytes become their tokens, then the lowest-ranked adjacent pair is
// merged, every occurrence left to right (GPT-2's encoder.py), until no adjacent pair has a merge.
// Pieces are cached (text repeats words); encode is safe to call from several threads.
class BpeMerges {
 public:
  void set_byte_token(uint8_t byte, int32_t id) { byte_id_[byte] = id; }
  // Tokens a, b merge into `merged` at `rank` (lower ranks merge first); replaces the pair's earlier merge.
  void set(int32_t a, int32_t b, int32_t rank, int32_t merged) { merges_[key(a, b)] = Merge{rank, merged}; }
  bool has(int32_t a, int32_t b) const { return merges_.count(key(a, b)) > 0; }
  bool empty() const { return merges_.empty(); }
  // Appends the tokens of `piece` (non-empty bytes) to ids.
  void encode(const std::string& piece, std::vector<int32_t>& ids) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;  // (a id, b id) -> rank and merged id
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace relay
