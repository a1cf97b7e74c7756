// Documents of a training corpus, for `relay data tokenize`: JSON Lines (one JSON object per line, the
// document in one string field: FineWeb's, SlimPajama's, The Stack's form) or plain text (a file is one
// document, or documents are cut at blank lines or at a separator string), each file plain or
// zstd-compressed (a name ending in .zst). Records are read in order, file after file, and handed out in
// batches of raw records with their file and line, so that the expensive part of a record (JSON parsing, the
// UTF-8 check, tokenization) can run on worker threads while the order of the output stays the input's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace relay {

struct CorpusOptions {
  std::string format = "text";  // "text" | "jsonl"
  std::string field = "text";   // jsonl: the string field that holds a record's document
  // text: "" = one document per file; "blank-line" = documents separated by one or more empty lines;
  // anything else = the literal separator string ("\n" escapes read as a newline).
  std::string doc_separator;
};

// One record as read: a JSONL line (still JSON) or a text document, and where it starts.
struct RawRecord {
  std::string data;
  int file = 0;      // index into the input paths
  int64_t line = 0;  // 1-based line of the file where the record starts
};

class CorpusReader {
 public:
  // Opens nothing yet; a missing file is an error naming it when its turn comes (and before, in the constructor,
  // which checks every path exists and is readable so that a typo fails at once).
  CorpusReader(std::vector<std::string> paths, CorpusOptions options);
  ~CorpusReader();
  CorpusReader(const CorpusReader&) = delete;
  CorpusReader& operator=(const CorpusReader&) = delete;

  // Appends records until about max_bytes of record data are in `out` (at least one record) or the input ends;
  // false when no record was added (the end).
  bool next_batch(std::vector<RawRecord>& out, size_t max_bytes);

  const std::vector<std::string>& paths() const { return paths_; }
  uint64_t total_bytes() const { return total_bytes_; }  // the input files' sizes as stored
  uint64_t bytes_read() const;                           // of those, read so far (compressed bytes for .zst)

 private:
  struct Source;  // one open file: plain or zstd, line by line
  bool open_next();
  bool read_record(RawRecord& r);

  std::vector<std::string> paths_;
  CorpusOptions options_;
  std::string separator_;  // text with a literal separator: the unescaped separator
  uint64_t total_bytes_ = 0, done_bytes_ = 0;
  int next_file_ = 0;
  std::unique_ptr<Source> source_;
};

// What a worker makes of a raw record: the document's text, or why the record is bad ("invalid JSON: ...",
// "no string field \"text\"", "invalid UTF-8 at byte 17"). check_utf8: false for the bytes tokenizer.
struct ParsedRecord {
  std::string text;
  std::string error;  // empty when the record is good
};
ParsedRecord parse_record(const RawRecord& r, const CorpusOptions& options, bool check_utf8);

}  // namespace relay
