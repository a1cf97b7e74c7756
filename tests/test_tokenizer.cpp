// Tokenizers and token files: the byte tokenizer's round trip, GPT-2's BPE on a hand-made vocabulary
// and merge table (merge order by rank, the pre-tokenizer's splits, decoding), errors that name the
// file, and token files written, validated and read back (uint16 and int32, sequences and targets,
// every bad-input case). tiktoken equivalence on real text: tests/torch/test_tiktoken_equivalence.py.
#include <gtest/gtest.h>

#include "io/token_dataset.hpp"
#include "io/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace relay;
using namespace relay::test;

namespace {

// A GPT-2-style vocabulary: the 256 byte symbols, then merged tokens. Byte b's symbol is itself for
// printable ASCII; the space is U+0120 ("Ġ").
void write_tiny_bpe(const TempDir& dir) {
  std::string vocab = "{";
  auto sym = [](int b) -> std::string {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable && b < 0x80) return b == '"' ? "\\\"" : b == '\\' ? "\\\\" : std::string(1, char(b));
    char buf[16];
    int cp = printable ? b : 0;
    if (!printable) {  // the n-th non-printable byte maps to U+0100 + n
      int n = 0;
      for (int k = 0; k < b; ++k)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) ++n;
      cp = 256 + n;
    }
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    return buf;
  };
  for (int b = 0; b < 256; ++b) vocab += "\"" + sym(b) + "\": " + std::to_string(b) + ", ";
  vocab += "\"lo\": 256, \"low\": 257, \"\\u0120lo\": 258, \"\\u0120low\": 259, \"er\": 260, \"<|endoftext|>\": 261}";
  write_file(dir.file("vocab.json"), vocab);
  // Ranks: "l o" first, then "lo w", "Ġ low", "e r" (and "Ġ lo" last: "lo w" wins before it applies).
  write_file(dir.file("merges.txt"), "#version: 0.2\nl o\nlo w\n\u0120 low\ne r\n\u0120 lo\n");
}

}  // namespace

TEST(Tokenizer, BytesRoundTrip) {
  auto t = make_tokenizer("bytes");
  const std::string text = "héllo\n\t\x01\xff";
  auto ids = t->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xc3);
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->end_of_text(), -1);
}

TEST(Tokenizer, Gpt2BpeMergesByRankAndSplitsLikeGpt2) {
  TempDir dir;
  write_tiny_bpe(dir);
  auto t = make_tokenizer("gpt2", dir.file("vocab.json"), dir.file("merges.txt"));
  EXPECT_EQ(t->vocab_size(), 262);
  EXPECT_EQ(t->end_of_text(), 261);
  // "low lower": pieces "low", " lower" -> [low] [Ġlow][er]
  EXPECT_EQ(t->encode("low lower"), (std::vector<int32_t>{257, 259, 260}));
  // Contractions and digits are their own pieces; "lol" merges "l o" only.
  EXPECT_EQ(t->encode("lol's"), (std::vector<int32_t>{256, 'l', '\'', 's'}));
  // Two spaces before a word: the first stays alone ("\s+(?!\S)"), the second joins the word.
  EXPECT_EQ(t->encode("a  low"), (std::vector<int32_t>{'a', 32, 259}));
  for (std::string s : {"low lower lowest", "  x\n\n y", "naïve 日本 🎉"}) EXPECT_EQ(t->decode(t->encode(s)), s);
}

TEST(Tokenizer, ErrorsNameTheFile) {
  TempDir dir;
  write_file(dir.file("bad.json"), "{ not json");
  write_file(dir.file("merges.txt"), "#version: 0.2\na b\n");
  try {
    make_tokenizer("gpt2", dir.file("bad.json"), dir.file("merges.txt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: not valid JSON"), std::string::npos) << e.what();
  }
  try {
    make_tokenizer("gpt2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab FILE --merges FILE"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer("sentencepiece"), Error);
  EXPECT_EQ(first_invalid_utf8("ok \xc3\xa9 \xff"), 6);
  EXPECT_EQ(first_invalid_utf8("ok \xc3\xa9"), -1);
}

TEST(TokenFile, WriteValidateAndReadSequences) {
  TempDir dir;
  std::vector<int32_t> t(41);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 7 % 300);
  write_token_file(dir.file("u16.h5"), t, 300, "bytes");       // uint16
  write_token_file(dir.file("i32.h5"), t, 70000, "gpt2");       // int32 (vocabulary > 65,536)
  for (std::string f : {"u16.h5", "i32.h5"}) {
    TokenDataset d(dir.file(f), 8, 70000, "data.train");
    EXPECT_EQ(d.sequences(), 5);  // (41 - 1) / 8
    EXPECT_EQ(d.length(), 41);
    std::vector<int32_t> in(16), tg(16);
    d.read({4, 1}, in.data(), tg.data());
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(in[static_cast<size_t>(j)], t[static_cast<size_t>(32 + j)]);
      EXPECT_EQ(tg[static_cast<size_t>(j)], t[static_cast<size_t>(33 + j)]);
      EXPECT_EQ(in[static_cast<size_t>(8 + j)], t[static_cast<size_t>(8 + j)]);
    }
  }
  EXPECT_NE(describe_token_file(dir.file("u16.h5")).find("uint16 [41]"), std::string::npos);
  EXPECT_NE(describe_token_file(dir.file("i32.h5")).find("int32 [41]"), std::string::npos);
}

TEST(TokenFile, BadFilesAreClearErrors) {
  TempDir dir;
  auto expect = [&](const std::string& path, int64_t T, int64_t vocab, const std::string& piece) {
    try {
      TokenDataset d(path, T, vocab, "data.train");
      ADD_FAILURE() << "accepted " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("data.train: " + path), std::string::npos) << e.what();
    }
  };
  std::vector<int32_t> t(100, 3);
  t[57] = 500;
  write_token_file(dir.file("big.h5"), t, 1000, "gpt2");
  EXPECT_EQ(TokenDataset(dir.file("big.h5"), 8, 1000, "data.train").vocab_size(), 1000);
  expect(dir.file("big.h5"), 8, 400, "vocab_size is 1000");
  write_token_file(dir.file("range.h5"), t, 256, "bytes");
  expect(dir.file("range.h5"), 8, 256, "token 500 at position 57");
  write_token_file(dir.file("short.h5"), std::vector<int32_t>(8, 1), 256, "bytes");
  expect(dir.file("short.h5"), 8, 256, "fewer than one sequence of model.block_size + 1 = 9");
  write_token_file(dir.file("weird.h5"), std::vector<int32_t>(20, 1), 256, "sentencepiece");
  expect(dir.file("weird.h5"), 8, 256, "expected \"bytes\" or \"gpt2\"");
  expect(dir.file("missing.h5"), 8, 256, "no such file");
  write_file(dir.file("text.h5"), "not hdf5");
  expect(dir.file("text.h5"), 8, 256, "not an HDF5 file");
  // An MLP file has no /tokens.
  run_command(relay_binary() + " data synth --out " + dir.file("mlp.h5") + " --samples 8 --features 2 --classes 2 --seed 1");
  expect(dir.file("mlp.h5"), 8, 256, "dataset /tokens is missing");
}
