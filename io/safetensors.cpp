// safetensors writing and reading, the JSON header through nlohmann::json.
#include "io/safetensors.hpp"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;

namespace relay {

void write_safetensors(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, const std::string& dtype) {
  const bool bf16_out = dtype == "BF16";
  const uint64_t elem = bf16_out ? 2 : 4;
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(shape_numel(t.shape)) * elem;
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';  // the data section starts 8-byte aligned
  const std::string tmp = cat(path, ".tmp-", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(cat("--out ", path, ": cannot write ", tmp, ": ", std::strerror(errno)));
    const uint64_t n = h.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    std::vector<bf16> half;  // (numel) one tensor rounded, when writing BF16
    for (const auto& t : tensors) {
      const size_t n = static_cast<size_t>(shape_numel(t.shape));
      if (!bf16_out) {
        f.write(reinterpret_cast<const char*>(t.values()), static_cast<std::streamsize>(n * sizeof(float)));
        continue;
      }
      half.resize(n);
      for (size_t i = 0; i < n; ++i) half[i] = f32_to_bf16(t.values()[i]);
      f.write(reinterpret_cast<const char*>(half.data()), static_cast<std::streamsize>(n * sizeof(bf16)));
    }
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(cat("--out ", path, ": writing failed: ", std::strerror(errno)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(cat("--out ", path, ": cannot rename the temporary file into place"));
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const std::string where = cat("safetensors file ", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat(where, ": cannot open the file"));
  const uint64_t size = fs::file_size(path);
  unsigned char len[8] = {};
  if (size < 8 || !f.read(reinterpret_cast<char*>(len), 8)) throw Error(cat(where, ": too short to be safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > size - 8 || n > (uint64_t(100) << 20))
    throw Error(cat(where, ": header length ", n, " does not fit the file (", size, " bytes); not safetensors"));
  std::string h(n, '\0');
  f.read(h.data(), static_cast<std::streamsize>(n));
  data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(where, ": the header is not valid JSON (", e.what(), ")"));
  }
  if (!header.is_object()) throw Error(cat(where, ": the header is not a JSON object"));
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      Entry e;
      e.name = name;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<Shape>();
      e.begin = v.at("data_offsets").at(0).get<uint64_t>();
      e.end = v.at("data_offsets").at(1).get<uint64_t>();
      const uint64_t elem = e.dtype == "F32" ? 4 : (e.dtype == "F16" || e.dtype == "BF16") ? 2 : 0;
      if (elem && (e.end - e.begin) != elem * static_cast<uint64_t>(shape_numel(e.shape)))
        throw Error(cat("its byte range holds ", e.end - e.begin, " bytes, not ", shape_str(e.shape), " of ", e.dtype));
      if (e.end < e.begin || data_start_ + e.end > size)
        throw Error(cat("its bytes [", e.begin, ", ", e.end, ") lie beyond the end of the file (truncated?)"));
      entries_.push_back(std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      throw Error(cat(where, ": tensor ", name, ": malformed header entry (", ex.what(), ")"));
    } catch (const Error& ex) {
      throw Error(cat(where, ": tensor ", name, ": ", ex.what()));
    }
  }
}

const SafetensorsFile::Entry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsFile::read(const std::string& name, const Shape& expected, float* out) const {
  const std::string where = cat("safetensors file ", path_, ": tensor ", name);
  const Entry* e = find(name);
  if (!e) throw Error(cat(where, " is missing"));
  if (e->shape != expected)
    throw Error(cat(where, " has shape ", shape_str(e->shape), " but the model expects ", shape_str(expected)));
  std::ifstream f(path_, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(data_start_ + e->begin));
  const size_t n = static_cast<size_t>(shape_numel(expected));
  if (e->dtype == "F32") {
    f.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n * 4));
  } else if (e->dtype == "F16" || e->dtype == "BF16") {
    std::vector<uint16_t> h(n);
    f.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(n * 2));
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      if (e->dtype == "BF16") {
        bits = uint32_t(h[i]) << 16;
      } else {  // IEEE half -> float
        const uint32_t sign = uint32_t(h[i] & 0x8000) << 16, ex = (h[i] >> 10) & 0x1f, man = h[i] & 0x3ff;
        if (ex == 0) {
          float v = std::ldexp(float(man), -24);
          std::memcpy(&bits, &v, 4);
          bits |= sign;
        } else if (ex == 31) {
          bits = sign | 0x7f800000u | (man << 13);
        } else {
          bits = sign | ((ex + 112) << 23) | (man << 13);
        }
      }
      std::memcpy(&out[i], &bits, 4);
    }
  } else {
    throw Error(cat(where, " is ", e->dtype, "; Relay reads F32, F16 and BF16"));
  }
  if (!f) throw Error(cat(where, ": the file is shorter than its header says (truncated?)"));
}

}  // namespace relay
