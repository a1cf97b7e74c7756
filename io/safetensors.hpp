// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}, then
// the raw little-endian tensor bytes. Relay writes F32 or BF16 and reads F32, F16 and BF16, so weights saved
// by PyTorch (safetensors.torch.save_file) load as they are.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace relay {

// Writes tensors and string metadata, atomically (a temporary file, then a rename), as dtype "F32" or
// "BF16" (rounded to nearest even, as torch's .to(torch.bfloat16)).
void write_safetensors(const std::string& path, const std::vector<CheckpointTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, const std::string& dtype = "F32");

class SafetensorsFile {
 public:
  struct Entry {
    std::string name, dtype;  // "F32" | "F16" | "BF16" (others are listed but cannot be read)
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range in the data section
  };
  // Reads and checks the header (size, JSON, every entry's dtype, shape and byte range against the
  // file size). Errors name the file and what is wrong.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const;
  // Reads one tensor as float32; an Error names the tensor and both shapes when `expected` differs.
  void read(const std::string& name, const Shape& expected, float* out) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace relay
