#include "io/tokenizer.hpp"

#include "core/error.hpp"

namespace relay {

namespace {
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t i : ids) s += static_cast<char>(i & 0xff);
    return s;
  }
};
}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string&, const std::string&) {
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  throw Error(cat("tokenizer \"", kind, "\" is not available in this build"));
}

}  // namespace relay
