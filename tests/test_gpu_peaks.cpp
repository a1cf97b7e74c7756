// The GPU peak table behind MFU: names as cudaDeviceProp reports them, the more specific name first.
#include <gtest/gtest.h>

#include "backend/gpu_peaks.hpp"

using namespace relay;

TEST(GpuPeaks, NamesAndPrecisions) {
  EXPECT_DOUBLE_EQ(gpu_peak_flops("cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)", Precision::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA H100 PCIe", Precision::bf16), 756.5e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA H200", Precision::fp32), 66.9e12);
  EXPECT_DOUBLE_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB", Precision::fp32), 19.5e12);
  EXPECT_EQ(gpu_peak_flops("cpu (oneDNN sgemm, 2 threads)", Precision::fp32), 0.0);
}
