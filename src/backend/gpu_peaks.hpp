// Peak dense GEMM throughput by GPU name, for model FLOPs utilisation (MFU = achieved / peak).
// Figures from NVIDIA's data sheets (dense, no sparsity): H100 SXM5 and H200 (NVIDIA H100/H200 Tensor
// Core GPU data sheets): bf16 989.4 TFLOP/s, tf32 494.7, fp32 66.9; H100 PCIe: bf16 756.5, tf32
// 378, fp32 51.2; A100 SXM/PCIe (A100 data sheet): bf16 312, tf32 156, fp32 19.5.
#pragma once
#include <string>

#include "backend/backend.hpp"

namespace relay {

// Peak FLOP/s of the GPU whose name (cudaDeviceProp::name, as Backend::describe() prints it) contains
// one of the table's names, for GEMMs in `precision`; 0 when the GPU is not in the table.
double gpu_peak_flops(const std::string& device_name, Precision precision);

}  // namespace relay
