// The byte-level alphabet and the pre-tokenizer regular expressions (PCRE2, UTF + UCP).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "io/byte_level.hpp"

#include <limits>

#include <pcre2.h>

#include "core/error.hpp"
#include "io/unicode_classes.hpp"

namespace relay {

std::string utf8_char(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

const std::array<std::string, 256>& byte_level_alphabet() {
  static const std::array<std::string, 256> m = [] {
    std::array<std::string, 256> a;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      a[b] = utf8_char(printable ? b : next++);
    }
    return a;
  }();
  return m;
}

#define RELAY_WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
const char* const kGpt2PatternPcre2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" RELAY_WS
                                      "\\p{L}\\p{N}]+|[" RELAY_WS "]+(?![^" RELAY_WS "])|[" RELAY_WS "]+";
const char* const kLlama3PatternPcre2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" RELAY_WS
                                        "\\p{L}\\p{N}]+[\\r\\n]*|[" RELAY_WS "]*[\\r\\n]+|[" RELAY_WS "]+(?![^" RELAY_WS
                                        "])|[" RELAY_WS "]+";
#undef RELAY_WS
const char* const kGpt2PatternHf = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3PatternHf =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// `pattern` with \p{L} and \p{N} spelled out as the generated ranges (io/unicode_classes.hpp): inside
// a character class as more ranges, outside as a class of their own.
std::string expand_unicode_classes(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const std::string esc = pattern.substr(i, 5);
      const char* ranges = esc == "\\p{L}" ? kUnicodeLetters : esc == "\\p{N}" ? kUnicodeNumbers : nullptr;
      if (ranges) {
        if (!in_class) out += '[';  // outside a class: a class of its own
        out += ranges;
        if (!in_class) out += ']';
        i += 4;
      } else {
        out += pattern.substr(i, 2);
        ++i;
      }
      continue;
    }
    if (c == '[') in_class = true;
    if (c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

PretokenRegex::PretokenRegex(const char* pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string expanded = expand_unicode_classes(pattern);
  re_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded.c_str()), expanded.size(), PCRE2_UTF | PCRE2_UCP, &err,
                      &off, nullptr);
  RELAY_ASSERT(re_, "a pre-tokenizer pattern does not compile in PCRE2 (error " << err << " at " << off << ")");
  pcre2_jit_compile(re_, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
}

PretokenRegex::~PretokenRegex() { pcre2_code_free(re_); }

void PretokenRegex::split(const std::string& text, std::vector<std::pair<size_t, size_t>>& spans) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re_, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE at = 0, gap = 0;  // gap: where the text not yet covered by a span starts
  while (at < text.size()) {
    // UTF-8 is checked once by the caller: PCRE2 would otherwise re-validate the whole text on every call.
    const int rc = pcre2_match(re_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw Error(cat("pre-tokenizer: the text is not valid UTF-8 near byte ", at, " (PCRE2 error ", rc, ")"));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {  // an empty match: step over one character (none of the patterns has one)
      at = ov[0] + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (ov[0] > gap) spans.emplace_back(gap, ov[0]);
    spans.emplace_back(ov[0], ov[1]);
    at = gap = ov[1];
  }
  pcre2_match_data_free(md);
  if (gap < text.size()) spans.emplace_back(gap, text.size());
}

void BpeMerges::encode(const std::string& piece, std::vector<int32_t>& ids) const {
  {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> sym, merged;  // (piece bytes,) -> merged token ids
  for (unsigned char c : piece) sym.push_back(byte_id_[c]);
  while (sym.size() > 1) {
    Merge best{std::numeric_limits<int32_t>::max(), -1};
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges_.find(key(sym[i], sym[i + 1]));
      if (it != merges_.end() && it->second.rank < best.rank) {
        best = it->second;
        best_key = it->first;
      }
    }
    if (best.id < 0) break;
    merged.clear();
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && key(sym[i], sym[i + 1]) == best_key) {
        merged.push_back(best.id);
        i += 2;
      } else {
        merged.push_back(sym[i++]);
      }
    }
    sym.swap(merged);
  }
  ids.insert(ids.end(), sym.begin(), sym.end());
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() < 1000000) cache_.emplace(piece, std::move(sym));
}

}  // namespace relay
