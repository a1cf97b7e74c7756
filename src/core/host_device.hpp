// RELAY_HOST_DEVICE: a function both the host and CUDA kernels call, so that the CPU reference and the GPU compute
// one definition (core/fp8.hpp's conversions, kernels/rope_angles.hpp's angles). Empty for the host compiler;
// __host__ __device__ under nvcc (__CUDACC__), whose device pass (__CUDA_ARCH__) then takes the device branches.
#pragma once

#if defined(__CUDACC__)
#define RELAY_HOST_DEVICE __host__ __device__
#else
#define RELAY_HOST_DEVICE
#endif
