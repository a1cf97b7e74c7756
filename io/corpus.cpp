#include "io/corpus.hpp"

#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/tokenizer.hpp"

namespace relay {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "\n", "\t" and "\\" in a --doc-separator as typed on a command line.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

// One input file, plain or zstd-compressed, read forward in chunks: decompressed bytes wait in `pending` from
// `pos` on; `line` is the 1-based line number at `pos`.
struct CorpusReader::Source {
  std::string path;
  std::ifstream file;
  bool zstd = false;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<char> in_buf;
  ZSTD_inBuffer in{nullptr, 0, 0};
  size_t last_ret = 0;  // ZSTD_decompressStream's last return: 0 at the end of a frame
  std::string pending;
  size_t pos = 0;
  bool eof = false;
  uint64_t raw_read = 0;  // bytes of the file read so far
  int64_t line = 1;

  Source(const std::string& p) : path(p), file(p, std::ios::binary), zstd(ends_with(p, ".zst")) {
    if (!file) throw Error(cat("--in ", path, ": cannot open the file"));
    if (zstd) {
      dctx = ZSTD_createDCtx();
      if (!dctx) throw Error(cat("--in ", path, ": out of memory for the zstd decoder"));
      in_buf.resize(ZSTD_DStreamInSize());
    }
  }
  ~Source() {
    if (dctx) ZSTD_freeDCtx(dctx);
  }

  // Appends more of the file to pending; false at its end.
  bool fill() {
    if (eof) return false;
    if (pos > (size_t(1) << 20)) {  // drop what was consumed
      pending.erase(0, pos);
      pos = 0;
    }
    if (!zstd) {
      in_buf.resize(size_t(1) << 20);
      file.read(in_buf.data(), std::streamsize(in_buf.size()));
      const auto got = file.gcount();
      raw_read += uint64_t(got);
      if (got <= 0) return !(eof = true);
      pending.append(in_buf.data(), size_t(got));
      return true;
    }
    std::vector<char> out(ZSTD_DStreamOutSize());
    for (;;) {
      if (in.pos == in.size) {
        file.read(in_buf.data(), std::streamsize(in_buf.size()));
        const auto got = file.gcount();
        raw_read += uint64_t(got);
        if (got <= 0) {
          if (last_ret != 0)
            throw Error(cat("--in ", path, ": the zstd data ends in the middle of a frame (a truncated file?)"));
          return !(eof = true);
        }
        in = {in_buf.data(), size_t(got), 0};
      }
      ZSTD_outBuffer o{out.data(), out.size(), 0};
      last_ret = ZSTD_decompressStream(dctx, &o, &in);
      if (ZSTD_isError(last_ret))
        throw Error(cat("--in ", path, ": not valid zstd data (", ZSTD_getErrorName(last_ret), ")"));
      if (o.pos > 0) {
        pending.append(out.data(), o.pos);
        return true;
      }
    }
  }

  // The rest of the file into out; false when nothing is left.
  bool read_all(std::string& out) {
    while (fill()) {
    }
    if (pos >= pending.size()) return false;
    out.assign(pending, pos, std::string::npos);
    line += std::count(out.begin(), out.end(), '\n');
    pos = pending.size();
    return true;
  }

  // The text up to the next `delim` (excluded) into out; false when nothing is left. The last piece may lack
  // the delimiter.
  bool read_until(const std::string& delim, std::string& out) {
    size_t from = pos;
    for (;;) {
      const size_t at = pending.find(delim, from);
      if (at != std::string::npos) {
        out.assign(pending, pos, at - pos);
        line += std::count(pending.begin() + std::ptrdiff_t(pos), pending.begin() + std::ptrdiff_t(at + delim.size()), '\n');
        pos = at + delim.size();
        return true;
      }
      from = pending.size() >= delim.size() ? std::max(pos, pending.size() - delim.size() + 1) : pos;
      const size_t consumed = pos;
      if (!fill()) break;
      from -= consumed - pos;  // fill() may have dropped the consumed prefix
    }
    if (pos >= pending.size()) return false;
    out.assign(pending, pos, std::string::npos);
    line += std::count(out.begin(), out.end(), '\n');
    pos = pending.size();
    return true;
  }
};

CorpusReader::CorpusReader(std::vector<std::string> paths, CorpusOptions options)
    : paths_(std::move(paths)), options_(std::move(options)) {
  if (options_.format != "text" && options_.format != "jsonl")
    throw Error(cat("--format: expected text or jsonl, got \"", options_.format, "\""));
  if (options_.format == "jsonl" && options_.field.empty()) throw Error("--field: the JSON field must not be empty");
  if (options_.format == "text" && !options_.doc_separator.empty() && options_.doc_separator != "blank-line")
    separator_ = unescape(options_.doc_separator);
  for (const std::string& p : paths_) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(p, ec);
    if (ec) throw Error(cat("--in ", p, ": cannot open the file (", ec.message(), ")"));
    total_bytes_ += size;
  }
}

CorpusReader::~CorpusReader() = default;

uint64_t CorpusReader::bytes_read() const { return done_bytes_ + (source_ ? source_->raw_read : 0); }

bool CorpusReader::open_next() {
  if (source_) {
    done_bytes_ += source_->raw_read;
    source_.reset();
  }
  if (next_file_ >= int(paths_.size())) return false;
  source_ = std::make_unique<Source>(paths_[size_t(next_file_)]);
  ++next_file_;
  return true;
}

// The next record of the current file; false at the file's end.
bool CorpusReader::read_record(RawRecord& r) {
  Source& s = *source_;
  r.file = next_file_ - 1;
  if (options_.format == "jsonl") {
    for (;;) {
      r.line = s.line;
      if (!s.read_until("\n", r.data)) return false;
      if (!blank(r.data)) return true;  // empty lines hold no record
    }
  }
  if (options_.doc_separator.empty()) {  // the whole file is one document
    r.line = 1;
    return s.read_all(r.data);
  }
  if (!separator_.empty()) {  // a literal separator
    for (;;) {
      r.line = s.line;
      if (!s.read_until(separator_, r.data)) return false;
      if (!r.data.empty()) return true;  // two separators in a row: no document
    }
  }
  // blank-line: non-empty lines joined by "\n"; one or more blank lines end a document.
  r.data.clear();
  std::string line;
  for (;;) {
    const int64_t at = s.line;
    if (!s.read_until("\n", line)) return !r.data.empty();
    if (blank(line)) {
      if (!r.data.empty()) return true;
      continue;
    }
    if (r.data.empty()) r.line = at;
    else r.data += '\n';
    r.data += line;
  }
}

bool CorpusReader::next_batch(std::vector<RawRecord>& out, size_t max_bytes) {
  size_t bytes = 0;
  bool added = false;
  while (bytes < max_bytes) {
    if (!source_ && !open_next()) break;
    RawRecord r;
    if (!read_record(r)) {
      done_bytes_ += source_->raw_read;
      source_.reset();
      continue;
    }
    bytes += r.data.size() + 1;
    out.push_back(std::move(r));
    added = true;
  }
  return added;
}

ParsedRecord parse_record(const RawRecord& r, const CorpusOptions& options, bool check_utf8) {
  ParsedRecord p;
  if (options.format == "text") {
    const int64_t bad = check_utf8 ? first_invalid_utf8(r.data) : -1;
    if (bad >= 0) p.error = cat("invalid UTF-8 at byte ", bad, " of the document");
    else p.text = r.data;
    return p;
  }
  std::string_view line = r.data;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const int64_t bad = first_invalid_utf8(std::string(line));
  if (bad >= 0) {
    p.error = cat("invalid UTF-8 at byte ", bad, " of the line");
    return p;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    const size_t at = what.find("] ");
    p.error = cat("invalid JSON (", at == std::string::npos ? what : what.substr(at + 2), ")");
    return p;
  }
  if (!j.is_object()) {
    p.error = cat("not a JSON object (a ", j.type_name(), ")");
    return p;
  }
  const auto it = j.find(options.field);
  if (it == j.end()) {
    p.error = cat("no field \"", options.field, "\"");
    return p;
  }
  if (!it->is_string()) {
    p.error = cat("field \"", options.field, "\" is a ", it->type_name(), ", not a string");
    return p;
  }
  p.text = it->get<std::string>();
  return p;
}

}  // namespace relay
