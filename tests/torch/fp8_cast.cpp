// Relay's float <-> FP8 conversions (src/core/fp8.hpp) as a filter, for tests/torch/test_fp8_casts.py, which compares
// them with PyTorch's torch.float8_e4m3fn / torch.float8_e5m2 casts.
//   fp8_cast encode e4m3|e5m2   float32 values (native byte order) on stdin -> one fp8 code a value on stdout
//   fp8_cast decode e4m3|e5m2   the float32 value of every code 0..255 on stdout
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/fp8.hpp"

int main(int argc, char** argv) {
  using namespace relay;
  if (argc != 3 || (std::strcmp(argv[2], "e4m3") != 0 && std::strcmp(argv[2], "e5m2") != 0) ||
      (std::strcmp(argv[1], "encode") != 0 && std::strcmp(argv[1], "decode") != 0)) {
    std::fprintf(stderr, "usage: fp8_cast encode|decode e4m3|e5m2\n");
    return 2;
  }
  const Fp8Format fmt = std::strcmp(argv[2], "e4m3") == 0 ? Fp8Format::e4m3 : Fp8Format::e5m2;
  if (std::strcmp(argv[1], "decode") == 0) {
    float values[256];  // (256) the value of each code
    for (int b = 0; b < 256; ++b) values[b] = fp8_to_f32(uint8_t(b), fmt);
    return std::fwrite(values, sizeof(float), 256, stdout) == 256 ? 0 : 1;
  }
  std::vector<float> in;  // (n) the values to encode
  float buf[4096];
  for (size_t got; (got = std::fread(buf, sizeof(float), 4096, stdin)) > 0;) in.insert(in.end(), buf, buf + got);
  std::vector<uint8_t> out(in.size());  // (n) their codes
  for (size_t i = 0; i < in.size(); ++i) out[i] = f32_to_fp8(in[i], fmt);
  return std::fwrite(out.data(), 1, out.size(), stdout) == out.size() ? 0 : 1;
}
