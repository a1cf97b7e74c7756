#include "io/tfevents.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace relay {

namespace {

// Protocol buffer wire format (protobuf.dev/programming-guides/encoding): a key is
// (field number << 3) | wire type; 0 = varint, 1 = 64-bit, 2 = length-delimited, 5 = 32-bit.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void little_endian(std::string& out, T v) {  // fixed64 / fixed32 fields; x86 and ARM are little-endian
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof v);
}
void bytes_field(std::string& out, int field, const std::string& s) {
  varint(out, (uint64_t(field) << 3) | 2);
  varint(out, s.size());
  out += s;
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  varint(e, (1 << 3) | 1);
  little_endian(e, wall);
  varint(e, (2 << 3) | 0);
  varint(e, static_cast<uint64_t>(step));
  if (file_version) bytes_field(e, 3, *file_version);
  if (summary) bytes_field(e, 5, *summary);
  return e;
}

// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
std::string summary(const std::vector<std::pair<std::string, double>>& values) {
  std::string s;
  for (auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    varint(value, (2 << 3) | 5);
    little_endian(value, static_cast<float>(v));
    bytes_field(s, 1, value);
  }
  return s;
}

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82f63b78u : 0u);  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(cat("log.tensorboard: cannot create ", dir, ": ", ec.message()));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const auto t = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  path_ = cat(dir, "/events.out.tfevents.", t.count(), ".", host, ".", getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw Error(cat("log.tensorboard: cannot write ", path_, ": ", std::strerror(errno)));
  const std::string version = "brain.Event:2";
  write_record(event(0, &version, nullptr));
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  const std::string s = summary(values);
  write_record(event(step, nullptr, &s));
}

// TFRecord: uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data); little-endian.
void EventFileWriter::write_record(const std::string& data) {
  std::string rec;
  const uint64_t len = data.size();
  little_endian(rec, len);
  little_endian(rec, masked_crc32c(rec.data(), 8));
  rec += data;
  little_endian(rec, masked_crc32c(data.data(), data.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw Error(cat("log.tensorboard: cannot write ", path_, ": ", std::strerror(errno)));
}

}  // namespace relay
