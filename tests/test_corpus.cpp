// Corpora for `relay data tokenize` (io/corpus.hpp): JSON Lines records with their file and line (blank lines,
// CRLF, a last line without a newline), text documents (one per file, cut at blank lines, cut at a literal
// separator), the same records from a zstd-compressed file, batches that keep the input order across files,
// and every bad input named: a missing file, truncated and corrupt zstd data, invalid JSON, a record that is not
// an object, a missing or non-string field, invalid UTF-8. The tokenizers-equivalence of the token files (plain
// and .zst, 1 and 4 workers, bad records skipped or named) is tests/torch/test_hf_tokenizer_equivalence.py.
#include <gtest/gtest.h>
#include <zstd.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/corpus.hpp"
#include "support/test_support.hpp"

using namespace relay;
using namespace relay::test;

namespace {

std::vector<RawRecord> read_all(const std::vector<std::string>& paths, const CorpusOptions& o, size_t batch = 1) {
  CorpusReader r(paths, o);
  std::vector<RawRecord> out, b;
  while (b.clear(), r.next_batch(b, batch)) out.insert(out.end(), b.begin(), b.end());
  EXPECT_EQ(r.bytes_read(), r.total_bytes());
  return out;
}

std::string zstd_compress(const std::string& text, int level = 3) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), level);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string error_of(const std::vector<std::string>& paths, const CorpusOptions& o) {
  try {
    read_all(paths, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kJsonl =
    "{\"text\": \"first\"}\n"
    "\n"
    "   \n"
    "{\"text\": \"second \\u00e9\\ud83c\\udf89\", \"id\": 2}\r\n"
    "{\"id\": 3, \"text\": \"third\\nline\"}";  // no newline at the end

}  // namespace

TEST(Corpus, JsonlRecordsKeepTheirLines) {
  TempDir dir;
  write_file(dir.file("a.jsonl"), kJsonl);
  CorpusOptions o;
  o.format = "jsonl";
  const auto recs = read_all({dir.file("a.jsonl")}, o);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].line, 1);
  EXPECT_EQ(recs[1].line, 4);
  EXPECT_EQ(recs[2].line, 5);
  EXPECT_EQ(parse_record(recs[0], o, true).text, "first");
  EXPECT_EQ(parse_record(recs[1], o, true).text, "second \xc3\xa9\xf0\x9f\x8e\x89");  // CRLF stripped, escapes decoded
  EXPECT_EQ(parse_record(recs[2], o, true).text, "third\nline");
}

TEST(Corpus, ZstdFilesGiveTheSameRecordsInOrderAcrossFiles) {
  TempDir dir;
  write_file(dir.file("a.jsonl"), kJsonl);
  std::string big;
  for (int i = 0; i < 20000; ++i) big += "{\"text\": \"record " + std::to_string(i) + " " + std::string(i % 97, 'x') + "\"}\n";
  write_file(dir.file("b.jsonl.zst"), zstd_compress(big) + zstd_compress("{\"text\": \"second frame\"}\n"));
  CorpusOptions o;
  o.format = "jsonl";
  for (size_t batch : {size_t(1), size_t(4096), size_t(1) << 30}) {
    const auto recs = read_all({dir.file("a.jsonl"), dir.file("b.jsonl.zst")}, o, batch);
    ASSERT_EQ(recs.size(), 3u + 20000u + 1u) << "batch " << batch;
    EXPECT_EQ(recs[3].file, 1);
    EXPECT_EQ(recs[3].line, 1);
    EXPECT_EQ(parse_record(recs[3 + 12345], o, true).text, "record 12345 " + std::string(12345 % 97, 'x'));
    EXPECT_EQ(recs[3 + 12345].line, 12346);
    EXPECT_EQ(parse_record(recs.back(), o, true).text, "second frame");
  }
}

TEST(Corpus, TextDocumentsPerFileAtBlankLinesOrAtASeparator) {
  TempDir dir;
  write_file(dir.file("a.txt"), "one\ntwo\n\n\n  \nthree\n\nfour\n");
  write_file(dir.file("b.txt"), "");
  write_file(dir.file("c.txt"), "x---y\n---\n---z");
  CorpusOptions o;  // one document per file; an empty file holds none
  auto recs = read_all({dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")}, o);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].data, "one\ntwo\n\n\n  \nthree\n\nfour\n");
  EXPECT_EQ(recs[1].file, 2);
  o.doc_separator = "blank-line";
  recs = read_all({dir.file("a.txt")}, o);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].data, "one\ntwo");
  EXPECT_EQ(recs[1].data, "three");
  EXPECT_EQ(recs[1].line, 6);
  EXPECT_EQ(recs[2].data, "four");
  EXPECT_EQ(recs[2].line, 8);
  o.doc_separator = "\\n---\\n";  // as typed on a command line
  recs = read_all({dir.file("c.txt")}, o);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].data, "x---y");
  EXPECT_EQ(recs[1].data, "---z");
  EXPECT_EQ(recs[1].line, 3);
}

TEST(Corpus, BadRecordsAreNamed) {
  CorpusOptions o;
  o.format = "jsonl";
  auto err = [&](const std::string& line) { return parse_record(RawRecord{line, 0, 7}, o, true).error; };
  EXPECT_NE(err("{\"text\": \"unterminated}").find("invalid JSON"), std::string::npos) << err("{\"text\": \"unterminated}");
  EXPECT_EQ(err("[1, 2]"), "not a JSON object (a array)");
  EXPECT_EQ(err("{\"body\": \"x\"}"), "no field \"text\"");
  EXPECT_EQ(err("{\"text\": 5}"), "field \"text\" is a number, not a string");
  EXPECT_EQ(err("{\"text\": \"a\xff\"}"), "invalid UTF-8 at byte 11 of the line");
  o.field = "body";
  EXPECT_EQ(err("{\"body\": \"x\"}"), "");
  CorpusOptions t;
  EXPECT_EQ(parse_record(RawRecord{"ok \xc3", 0, 1}, t, true).error, "invalid UTF-8 at byte 3 of the document");
  EXPECT_EQ(parse_record(RawRecord{"ok \xc3", 0, 1}, t, false).error, "");  // the bytes tokenizer reads any bytes
}

TEST(Corpus, BadFilesAreNamed) {
  TempDir dir;
  CorpusOptions o;
  o.format = "jsonl";
  EXPECT_NE(error_of({dir.file("missing.jsonl")}, o).find("missing.jsonl: cannot open the file"), std::string::npos);
  std::string noise;
  uint64_t x = 1;
  for (int i = 0; i < 100000; ++i) noise += char('a' + (x = x * 6364136223846793005ull + 1442695040888963407ull) % 26);
  const std::string z = zstd_compress(noise + "\n");
  write_file(dir.file("cut.jsonl.zst"), z.substr(0, z.size() / 2));
  EXPECT_NE(error_of({dir.file("cut.jsonl.zst")}, o).find("cut.jsonl.zst: the zstd data ends in the middle of a frame"),
            std::string::npos)
      << error_of({dir.file("cut.jsonl.zst")}, o);
  write_file(dir.file("plain.jsonl.zst"), "{\"text\": \"not compressed\"}\n");
  EXPECT_NE(error_of({dir.file("plain.jsonl.zst")}, o).find("plain.jsonl.zst: not valid zstd data"), std::string::npos)
      << error_of({dir.file("plain.jsonl.zst")}, o);
  o.format = "csv";
  EXPECT_NE(error_of({}, o).find("--format: expected text or jsonl"), std::string::npos);
}
