// Tokenizers and token files: the byte tokenizer's round trip, GPT-2's BPE on a hand-made vocabulary
// and merge table (merge order by rank, the pre-tokenizer's splits, decoding), errors that name the
// file, and token files written, validated and read back (uint16 and int32, sequences and targets,
// every bad-input case), and tokenizer.json files (both merges forms, GPT-2's and Llama 3's
// pre-tokenizers, added tokens, named errors). tiktoken equivalence on real text:
// tests/torch/test_tiktoken_equivalence.py; tokenizers': tests/torch/test_hf_tokenizer_equivalence.py.
#include <gtest/gtest.h>

#include "io/token_dataset.hpp"
#include "io/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace relay;
using namespace relay::test;

namespace {

// A GPT-2-style vocabulary: the 256 byte symbols, then merged tokens. Byte b's symbol is itself for
// printable ASCII; the space is U+0120 ("Ġ"). The entries of a JSON object, without braces.
std::string tiny_vocab_entries() {
  std::string vocab;
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
  return vocab + "\"lo\": 256, \"low\": 257, \"\\u0120lo\": 258, \"\\u0120low\": 259, \"er\": 260";
}

void write_tiny_bpe(const TempDir& dir) {
  write_file(dir.file("vocab.json"), "{" + tiny_vocab_entries() + ", \"<|endoftext|>\": 261}");
  // Ranks: "l o" first, then "lo w", "Ġ low", "e r" (and "Ġ lo" last: "lo w" wins before it applies).
  write_file(dir.file("merges.txt"), "#version: 0.2\nl o\nlo w\n\u0120 low\ne r\n\u0120 lo\n");
}

// A tokenizer.json of the same vocabulary and merges (as "a b" strings or ["a", "b"] pairs), plus
// "12" and "123" with their merges, added tokens and the given pre-tokenizer (JSON text).
std::string tiny_tokenizer_json(bool pair_merges, const std::string& pre_tokenizer,
                                const std::string& added_tokens = "", const std::string& model_type = "BPE") {
  const char* merges[] = {"l o", "lo w", "\\u0120 low", "e r", "\\u0120 lo", "1 2", "12 3"};
  std::string m;
  for (const char* x : merges) {
    std::string s(x);
    const size_t sp = s.find(' ');
    m += (m.empty() ? "" : ", ") +
         (pair_merges ? "[\"" + s.substr(0, sp) + "\", \"" + s.substr(sp + 1) + "\"]" : "\"" + s + "\"");
  }
  return "{\"version\": \"1.0\", \"added_tokens\": [" + added_tokens + "], \"normalizer\": null, \"pre_tokenizer\": " +
         pre_tokenizer + ", \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"" +
         model_type + "\", \"dropout\": null, \"unk_token\": null, \"vocab\": {" + tiny_vocab_entries() +
         ", \"12\": 261, \"123\": 262}, \"merges\": [" + m + "]}}";
}

const std::string kByteLevel = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})";
const std::string kLlama3 =
    R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|)"
    R"([^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, )"
    R"("behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";

// The message of the Error that make_tokenizer("hf", ...) throws for the tokenizer.json `text`.
std::string hf_error(const TempDir& dir, const std::string& text) {
  write_file(dir.file("bad.json"), text);
  try {
    make_tokenizer("hf", "", "", dir.file("bad.json"));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
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

TEST(HfTokenizer, BothMergesFormsGiveGpt2sIds) {
  TempDir dir;
  write_tiny_bpe(dir);
  auto gpt2 = make_tokenizer("gpt2", dir.file("vocab.json"), dir.file("merges.txt"));
  for (bool pairs : {false, true}) {
    write_file(dir.file("t.json"), tiny_tokenizer_json(pairs, kByteLevel));
    auto t = make_tokenizer("hf", "", "", dir.file("t.json"));
    EXPECT_EQ(t->name(), "hf");
    EXPECT_EQ(t->vocab_size(), 263);
    EXPECT_EQ(t->end_of_text(), -1);  // no <|endoftext|> and no <|end_of_text|>
    EXPECT_EQ(t->encode("low lower"), (std::vector<int32_t>{257, 259, 260})) << "pairs " << pairs;
    for (std::string s : {"lol's", "a  low", "low lower lowest", "  x\n\n y"})
      EXPECT_EQ(t->encode(s), gpt2->encode(s)) << s;
    // GPT-2's pattern keeps "1234123" whole: "1 2" merges both, then "12 3" both.
    EXPECT_EQ(t->encode("1234123"), (std::vector<int32_t>{262, '4', 262}));
    for (std::string s : {"low lower", "naïve 日本 🎉\r\n"}) EXPECT_EQ(t->decode(t->encode(s)), s);
  }
}

TEST(HfTokenizer, Llama3SplitAndPrefixSpace) {
  TempDir dir;
  write_file(dir.file("llama.json"), tiny_tokenizer_json(true, kLlama3));
  auto t = make_tokenizer("hf", "", "", dir.file("llama.json"));
  // Llama 3's pattern cuts digits in threes: "123" "412" "3".
  EXPECT_EQ(t->encode("1234123"), (std::vector<int32_t>{262, '4', 261, '3'}));
  EXPECT_EQ(t->encode("low lower"), (std::vector<int32_t>{257, 259, 260}));
  // add_prefix_space: " " before a text (and before every stretch between added tokens) that has none.
  std::string prefix = kByteLevel;
  prefix.replace(prefix.find("false"), 5, "true");
  write_file(dir.file("prefix.json"),
             tiny_tokenizer_json(false, prefix, R"({"id": 300, "content": "<|endoftext|>", "special": true})"));
  auto p = make_tokenizer("hf", "", "", dir.file("prefix.json"));
  EXPECT_EQ(p->encode("low<|endoftext|>low"), (std::vector<int32_t>{259, 300, 259}));
  EXPECT_EQ(p->encode(" low"), (std::vector<int32_t>{259}));
  EXPECT_EQ(p->encode(""), std::vector<int32_t>{});
}

TEST(HfTokenizer, AddedTokensLongestFirstAndStrip) {
  TempDir dir;
  const std::string added =
      R"({"id": 263, "content": "<|a|>", "special": true}, {"id": 264, "content": "<|a|>x", "special": false},)"
      R"({"id": 265, "content": "<|s|>", "lstrip": true, "rstrip": true},)"
      R"({"id": 400, "content": "<|end_of_text|>", "special": true, "normalized": false})";
  write_file(dir.file("t.json"), tiny_tokenizer_json(false, kByteLevel, added));
  auto t = make_tokenizer("hf", "", "", dir.file("t.json"));
  EXPECT_EQ(t->vocab_size(), 401);  // max id + 1 over the vocabulary and the added tokens
  EXPECT_EQ(t->end_of_text(), 400);
  // Matched literally before pre-tokenizing, the longest at the leftmost position first.
  EXPECT_EQ(t->encode("lo<|a|>xlow<|a|> low"), (std::vector<int32_t>{256, 264, 257, 263, 259}));
  // lstrip/rstrip take the white space next to the token into it.
  EXPECT_EQ(t->encode("a  <|s|>\t b"), (std::vector<int32_t>{'a', 265, 'b'}));
  EXPECT_EQ(t->decode({256, 264, 400}), "lo<|a|>x<|end_of_text|>");
  EXPECT_THROW(t->decode({300}), Error);  // an id that neither the vocabulary nor an added token has
}

TEST(HfTokenizer, ErrorsNameTheFileAndWhatIsNotSupported) {
  TempDir dir;
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  };
  const std::string bad = dir.file("bad.json");
  has(hf_error(dir, tiny_tokenizer_json(true, kByteLevel, "", "Unigram")),
      bad + ": tokenizer model type \"Unigram\" is not supported (Relay reads byte-level BPE tokenizer.json files)");
  has(hf_error(dir, tiny_tokenizer_json(true, kByteLevel, "", "WordPiece")), "model type \"WordPiece\" is not supported");
  std::string other = kLlama3;
  other.replace(other.find("\\\\p{N}{1,3}"), 11, "\\\\d+");
  has(hf_error(dir, tiny_tokenizer_json(true, other)), bad + ": pre_tokenizer.pretokenizers[0]: the Split regex \"");
  has(hf_error(dir, tiny_tokenizer_json(true, other)), "|\\\\d+| ?[^");  // quoted as the file has it
  std::string nfc = tiny_tokenizer_json(true, kByteLevel);
  nfc.replace(nfc.find("\"normalizer\": null"), 18, R"("normalizer": {"type": "NFC"})");
  has(hf_error(dir, nfc), bad + ": normalizer NFC is not supported");
  std::string merges = tiny_tokenizer_json(false, kByteLevel);
  merges.replace(merges.find("\"e r\""), 5, "\"e x\"");
  has(hf_error(dir, merges), bad + ": model.merges[3] (\"e\" \"x\"): the merged token is not in model.vocab");
  merges.replace(merges.find("\"e x\""), 5, "\"er\"");
  has(hf_error(dir, merges), "model.merges[3] is \"er\"; expected two tokens separated by one space");
  has(hf_error(dir, "{\"model\": [1,"), bad + ": not valid JSON");
  has(hf_error(dir, tiny_tokenizer_json(true, "null")), "pre_tokenizer is null");
  try {
    make_tokenizer("hf");
    FAIL();
  } catch (const Error& e) {
    has(e.what(), "--tokenizer-json FILE");
  }
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
  expect(dir.file("weird.h5"), 8, 256, "expected \"bytes\", \"gpt2\" or \"hf\"");
  expect(dir.file("missing.h5"), 8, 256, "no such file");
  write_file(dir.file("text.h5"), "not hdf5");
  expect(dir.file("text.h5"), 8, 256, "not an HDF5 file");
  // An MLP file has no /tokens.
  run_command(relay_binary() + " data synth --out " + dir.file("mlp.h5") + " --samples 8 --features 2 --classes 2 --seed 1");
  expect(dir.file("mlp.h5"), 8, 256, "dataset /tokens is missing");
}
