#include "backend/gpu_peaks.hpp"

namespace relay {

double gpu_peak_flops(const std::string& name, Precision p) {
  struct Peak {
    const char* name;
    double bf16, tf32, fp32;  // dense TFLOP/s
  };
  // Most specific names first: "H100 PCIe" before "H100".
  static const Peak table[] = {{"H100 PCIe", 756.5, 378.0, 51.2}, {"H200", 989.4, 494.7, 66.9},
                               {"H100", 989.4, 494.7, 66.9}, {"A100", 312.0, 156.0, 19.5}};
  for (const Peak& t : table)
    if (name.find(t.name) != std::string::npos) return 1e12 * (p == Precision::bf16 || p == Precision::fp8 ? t.bf16 : p == Precision::tf32 ? t.tf32 : t.fp32);
  return 0;
}

}  // namespace relay
