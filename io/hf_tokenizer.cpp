// tokenizer.json reader and encoder, following the `tokenizers` library's encode: added tokens are
// split out of the text first (matched literally, leftmost then longest, the way its Aho-Corasick
// automaton matches), each stretch between them goes through the pre-tokenizer steps (Split by a
// pattern, ByteLevel: optional prefix space, optional GPT-2 pattern, bytes -> the byte alphabet),
// and each piece is merged by BPE, lowest merge rank first (its BPE model with dropout off).
#include "io/hf_tokenizer.hpp"

#include <array>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.hpp"
#include "io/byte_level.hpp"

namespace relay {

namespace {

using json = nlohmann::json;

// Unicode's White_Space (Rust's char::is_whitespace), for the lstrip/rstrip of added tokens.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point that starts at byte i of valid UTF-8, and its length in bytes.
uint32_t code_point_at(const std::string& s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  *len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  uint32_t cp = *len == 1 ? c : *len == 2 ? (c & 0x1F) : *len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < *len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false, normalized = false;
};

// A stretch of the text: an added token (id >= 0) or plain text to pre-tokenize (id = -1).
struct Segment {
  size_t begin, end;
  int32_t id;
};

// One pre-tokenizer step: Split by a pattern (Isolated), or ByteLevel.
struct PreStep {
  const PretokenRegex* regex = nullptr;  // Split, or ByteLevel with use_regex (GPT-2's pattern); may be null
  bool byte_level = false;
  bool add_prefix_space = false;
};

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(const std::string& path) : path_(path) {
    std::ifstream f(path);
    if (!f) throw Error(cat("--tokenizer-json ", path, ": cannot open the file"));
    json j;
    try {
      f >> j;
    } catch (const std::exception& e) {
      throw Error(cat(path, ": not valid JSON (", e.what(), ")"));
    }
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      throw Error(cat(path, ": no \"model\" object; not a Hugging Face tokenizer.json"));
    try {
      read_model(j["model"]);
      read_added_tokens(j.value("added_tokens", json::array()));
      read_normalizer(j.value("normalizer", json()));
      read_pre_tokenizer(j.value("pre_tokenizer", json()));
      read_decoder(j.value("decoder", json()));
    } catch (const json::exception& e) {  // a key of the wrong JSON type
      fail(cat("unexpected JSON (", e.what(), ")"));
    }
    // post_processor (BOS/EOS templates) is not applied: Relay's data and prompts get no BOS of their own.
  }

  std::string name() const override { return "hf"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t end_of_text() const override {
    for (const char* t : {"<|endoftext|>", "<|end_of_text|>"}) {
      for (const AddedToken& a : added_)
        if (a.content == t) return a.id;
      auto it = vocab_.find(t);
      if (it != vocab_.end()) return it->second;
    }
    return -1;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    const int64_t bad = first_invalid_utf8(text);
    if (bad >= 0) throw Error(cat(path_, ": the text is not valid UTF-8 at byte ", bad));
    // tokenizers extracts the added tokens matched on the raw text first, then (in what is left)
    // those matched on normalized text; without a normalizer both are the raw text.
    std::vector<Segment> raw, segments;
    split_added(text, {0, text.size(), -1}, false, raw);
    for (const Segment& s : raw) {
      if (s.id >= 0) segments.push_back(s);
      else split_added(text, s, true, segments);
    }
    std::vector<int32_t> ids;
    std::vector<std::string> pieces;
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      pieces.clear();
      pre_tokenize(text.substr(s.begin, s.end - s.begin), pieces);
      for (const std::string& p : pieces) encode_piece(p, ids);
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[static_cast<size_t>(id)])
        throw Error(cat(path_, ": no token ", id));
      const std::string& s = id_to_token_[static_cast<size_t>(id)];
      if (added_ids_.count(id)) {  // an added token decodes to its text
        out += s;
        continue;
      }
      // ByteLevel decoder: each character back to its byte; a token with a character outside the
      // byte alphabet is taken as it is (tokenizers does the same).
      std::string bytes;
      bool whole = true;
      for (size_t i = 0; i < s.size();) {
        size_t n = 0;
        const uint32_t cp = code_point_at(s, i, &n);
        auto it = char_to_byte_.find(cp);
        if (it == char_to_byte_.end()) {
          whole = false;
          break;
        }
        bytes += static_cast<char>(it->second);
        i += n;
      }
      out += whole ? bytes : s;
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error(cat(path_, ": ", what)); }

  void read_model(const json& m) {
    std::string type = m.value("type", std::string());
    if (type.empty()) type = m.contains("merges") ? "BPE" : m.contains("vocab") && m["vocab"].is_array() ? "Unigram" : "";
    if (type != "BPE")
      fail(cat("tokenizer model type \"", type, "\" is not supported (Relay reads byte-level BPE tokenizer.json files)"));
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() > 0)
      fail("model.dropout is set; Relay's BPE encodes without dropout (set it to null)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
        fail(cat("model.", k, " is set; Relay reads byte-level BPE, which has none"));
    ignore_merges_ = m.value("ignore_merges", false);
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model.vocab is not an object of token -> id");
    for (auto& [tok, id] : m["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
        fail(cat("model.vocab: the id of token \"", tok, "\" is not a non-negative integer"));
      vocab_[tok] = id.get<int32_t>();
      set_token(id.get<int32_t>(), tok);
    }
    const auto& alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) {
      const std::string& sym = alphabet[static_cast<size_t>(b)];
      size_t n = 0;
      char_to_byte_[code_point_at(sym, 0, &n)] = static_cast<uint8_t>(b);
      auto it = vocab_.find(sym);
      if (it == vocab_.end())
        fail(cat("model.vocab has no token for byte ", b, " (\"", sym,
                 "\"); Relay reads byte-level BPE, whose vocabulary holds all 256 byte symbols"));
      bpe_.set_byte_token(static_cast<uint8_t>(b), it->second);
    }
    read_merges(m.value("merges", json::array()));
  }

  // Merges as "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20); rank = position.
  void read_merges(const json& merges) {
    if (!merges.is_array()) fail("model.merges is not a list");
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& e = merges[r];
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(cat("model.merges[", r, "] is \"", s, "\"; expected two tokens separated by one space"));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        fail(cat("model.merges[", r, "] is ", e.dump(), "; expected \"a b\" or [\"a\", \"b\"]"));
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        fail(cat("model.merges[", r, "] (\"", a, "\" \"", b, "\"): ",
                 iab == vocab_.end() ? "the merged token" : "a part", " is not in model.vocab"));
      if (!bpe_.has(ia->second, ib->second)) bpe_.set(ia->second, ib->second, static_cast<int32_t>(r), iab->second);
    }
  }

  void read_added_tokens(const json& added) {
    if (!added.is_array()) fail("added_tokens is not a list");
    for (size_t k = 0; k < added.size(); ++k) {
      const json& e = added[k];
      if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
          !e.contains("content") || !e["content"].is_string() || e["content"].get<std::string>().empty())
        fail(cat("added_tokens[", k, "] needs a non-negative integer \"id\" and a non-empty \"content\""));
      AddedToken a;
      a.content = e["content"].get<std::string>();
      a.id = e["id"].get<int32_t>();
      a.lstrip = e.value("lstrip", false);
      a.rstrip = e.value("rstrip", false);
      a.normalized = e.value("normalized", false);
      if (e.value("single_word", false))
        fail(cat("added_tokens[", k, "] (\"", a.content, "\") has single_word = true, which Relay does not read"));
      if (first_invalid_utf8(a.content) >= 0) fail(cat("added_tokens[", k, "]: content is not valid UTF-8"));
      set_token(a.id, a.content);
      added_ids_[a.id] = true;
      added_.push_back(a);
    }
    // Per first byte, longest first: the first that matches at a position is the longest match there.
    for (size_t k = 0; k < added_.size(); ++k)
      by_first_byte_[static_cast<unsigned char>(added_[k].content[0])].push_back(k);
    for (auto& list : by_first_byte_)
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t x, size_t y) { return added_[x].content.size() > added_[y].content.size(); });
  }

  void read_normalizer(const json& n) {
    if (n.is_null()) return;
    fail(cat("normalizer ", n.value("type", n.dump()), " is not supported (Relay reads tokenizer.json files without "
             "a normalizer, as GPT-2's and Llama 3's are)"));
  }

  // ByteLevel, or Sequence[Split(Regex, Isolated)..., ByteLevel(use_regex false)] (Llama 3, SmolLM).
  void read_pre_tokenizer(const json& p) {
    if (p.is_null()) fail("pre_tokenizer is null; Relay reads byte-level BPE (a ByteLevel pre-tokenizer)");
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      const json& list = p.value("pretokenizers", json::array());
      for (size_t k = 0; k < list.size(); ++k) read_pre_step(list[k], cat("pre_tokenizer.pretokenizers[", k, "]"));
    } else {
      read_pre_step(p, "pre_tokenizer");
    }
    bool byte_level = false;
    for (const PreStep& s : steps_) byte_level = byte_level || s.byte_level;
    if (!byte_level) fail("pre_tokenizer has no ByteLevel step; Relay reads byte-level BPE tokenizers");
    if (!steps_.back().byte_level) fail("pre_tokenizer: ByteLevel must be the last step");
  }

  void read_pre_step(const json& s, const std::string& where) {
    const std::string type = s.value("type", std::string());
    PreStep step;
    if (type == "ByteLevel") {
      step.byte_level = true;
      step.add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) step.regex = regex_for(kGpt2PatternHf, where);
    } else if (type == "Split") {
      const json& pat = s.value("pattern", json());
      if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
        fail(cat(where, ": a Split pattern other than a Regex (", pat.dump(), ") is not supported"));
      if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
        fail(cat(where, ": Split behavior \"", s.value("behavior", std::string()), "\"",
                 s.value("invert", false) ? " with invert" : "", " is not supported (Relay reads Isolated)"));
      step.regex = regex_for(pat["Regex"].get<std::string>(), where);
    } else {
      fail(cat(where, ": pre-tokenizer type \"", type, "\" is not supported (Relay reads ByteLevel and Split)"));
    }
    steps_.push_back(step);
  }

  // The compiled form of a pattern Relay knows; any other is a named error quoting it.
  const PretokenRegex* regex_for(const std::string& hf_pattern, const std::string& where) {
    if (hf_pattern == kGpt2PatternHf) {
      if (!gpt2_re_) gpt2_re_ = std::make_unique<PretokenRegex>(kGpt2PatternPcre2);
      return gpt2_re_.get();
    }
    if (hf_pattern == kLlama3PatternHf) {
      if (!llama3_re_) llama3_re_ = std::make_unique<PretokenRegex>(kLlama3PatternPcre2);
      return llama3_re_.get();
    }
    fail(cat(where, ": the Split regex ", json(hf_pattern).dump(),
             " is not supported (Relay knows GPT-2's and Llama 3's pre-tokenizer patterns)"));
  }

  void read_decoder(const json& d) {
    if (d.is_null() || d.value("type", std::string()) == "ByteLevel") return;
    fail(cat("decoder type \"", d.value("type", std::string()), "\" is not supported (Relay decodes ByteLevel)"));
  }

  void set_token(int32_t id, const std::string& tok) {
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(static_cast<size_t>(id) + 1);
      has_token_.resize(static_cast<size_t>(id) + 1, false);
    }
    id_to_token_[static_cast<size_t>(id)] = tok;
    has_token_[static_cast<size_t>(id)] = true;
  }

  // The added tokens (normalized ones or the others) in text[in.begin, in.end), as segments in order.
  void split_added(const std::string& text, Segment in, bool normalized, std::vector<Segment>& out) const {
    size_t done = in.begin;  // text before this is in `out`
    for (size_t at = in.begin; at < in.end;) {
      const AddedToken* hit = nullptr;
      for (size_t k : by_first_byte_[static_cast<unsigned char>(text[at])]) {
        const AddedToken& a = added_[k];
        if (a.normalized == normalized && a.content.size() <= in.end - at &&
            text.compare(at, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
      if (!hit) {
        ++at;
        continue;
      }
      size_t start = at, stop = at + hit->content.size();
      if (hit->lstrip)  // take the white space before the token into it, back to the last segment
        while (start > done) {
          size_t p = start - 1, n = 0;
          while (p > done && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
          if (!is_white_space(code_point_at(text, p, &n))) break;
          start = p;
        }
      if (hit->rstrip)
        for (size_t n = 0; stop < in.end && is_white_space(code_point_at(text, stop, &n));) stop += n;
      if (start > done) out.push_back({done, start, -1});
      out.push_back({start, stop, hit->id});
      done = at = stop;
    }
    if (done < in.end) out.push_back({done, in.end, -1});
  }

  // The pre-tokenizer steps; the pieces come out in the byte alphabet, ready for BPE.
  void pre_tokenize(const std::string& text, std::vector<std::string>& pieces) const {
    std::vector<std::string> next;
    std::vector<std::pair<size_t, size_t>> spans;
    pieces.assign(1, text);
    for (const PreStep& step : steps_) {
      next.clear();
      for (std::string& p : pieces) {
        if (step.add_prefix_space && p[0] != ' ') p.insert(p.begin(), ' ');  // per piece, as tokenizers does
        if (!step.regex) {
          next.push_back(std::move(p));
          continue;
        }
        spans.clear();
        step.regex->split(p, spans);
        for (auto [b, e] : spans) next.push_back(p.substr(b, e - b));
      }
      pieces.swap(next);
    }
  }

  // BPE of one pre-token (BpeMerges); with ignore_merges, a piece that is a token as a whole is that token.
  void encode_piece(const std::string& piece, std::vector<int32_t>& ids) const {
    if (ignore_merges_) {  // Llama 3 sets this
      std::string mapped;
      for (unsigned char c : piece) mapped += byte_level_alphabet()[c];
      auto it = vocab_.find(mapped);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    bpe_.encode(piece, ids);
  }

  std::string path_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // (vocab_size,): vocabulary and added tokens
  std::vector<bool> has_token_;           // (vocab_size,): false for ids that neither uses
  BpeMerges bpe_;
  std::unordered_map<uint32_t, uint8_t> char_to_byte_;  // the byte alphabet, inverted
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, bool> added_ids_;
  std::array<std::vector<size_t>, 256> by_first_byte_;  // indices into added_, longest first
  std::vector<PreStep> steps_;
  std::unique_ptr<PretokenRegex> gpt2_re_, llama3_re_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) { return std::make_unique<HfTokenizer>(path); }

}  // namespace relay
