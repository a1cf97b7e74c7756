// CHECK macros for CUDA runtime, cuBLAS and NCCL calls: a failure prints the call, the library's own
// message, file:line and a hint, then ends the whole job through relay::fatal (MPI_Abort).
// Plain C++: included from .cu files and from the CUDA backend's .cpp files.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.hpp"

namespace relay::cuda {

// Hints for the failures a user can fix; nullptr where there is nothing better than the message.
inline const char* cuda_error_hint(cudaError_t e) {
  switch (e) {
    case cudaErrorNoDevice:
      return "no CUDA device is visible: check CUDA_VISIBLE_DEVICES and that the job asked for GPUs "
             "(srun --gpus-per-task, --gres=gpu:N), or use train.device = \"cpu\"";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than the CUDA runtime Relay was built with: load a newer "
             "driver or build with an older CUDA toolkit";
    case cudaErrorInvalidDevice:
      return "the GPU index is not visible to this rank: check ranks per node against GPUs per node";
    case cudaErrorMemoryAllocation:
      return "out of GPU memory: raise train.micro_batches (smaller micro-batches) or lower train.batch_size or the model size, and check nvidia-smi for "
             "other processes on this GPU (two ranks sharing one GPU?)";
    case cudaErrorDevicesUnavailable:
      return "the GPU is busy or in exclusive-process mode and already used by another process";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "Relay was not compiled for this GPU: reconfigure with "
             "-DCMAKE_CUDA_ARCHITECTURES=<this GPU's sm, e.g. 90> and rebuild";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
      return "a kernel accessed invalid memory (the error may come from an earlier asynchronous "
             "launch): rerun with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find which";
    default:
      return nullptr;
  }
}

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  fatal(cat("CUDA call ", call, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)), file,
        line, cuda_error_hint(e));
}

inline const char* cublas_error_hint(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS could not start: usually out of GPU memory, or no usable GPU";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "out of GPU memory inside cuBLAS: raise train.micro_batches (smaller micro-batches) or lower train.batch_size or the model size";
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "this GPU does not support the GEMM's types: bf16 GEMMs need compute capability 8.0 "
             "or newer (A100, H100); use train.precision = \"fp32\"";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GEMM kernel failed to run: rerun with CUDA_LAUNCH_BLOCKING=1 to see the first error";
    default:
      return nullptr;
  }
}

[[noreturn]] inline void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line) {
  fatal(cat("cuBLAS call ", call, " failed: ", cublasGetStatusName(s), ": ", cublasGetStatusString(s)),
        file, line, cublas_error_hint(s));
}

// NCCL codes by value (ncclResult_t is stable ABI), so this header does not need nccl.h; the
// NCCL_CHECK macro itself is only expanded where nccl.h is included.
inline const char* nccl_error_hint(int code) {
  switch (code) {
    case 1:  // ncclUnhandledCudaError
      return "a CUDA call inside NCCL failed: check that every rank on a node uses its own GPU";
    case 2:  // ncclSystemError
      return "a system call failed (network or shared memory): check NCCL_SOCKET_IFNAME, the size of "
             "/dev/shm (containers: --shm-size), and rerun with NCCL_DEBUG=WARN";
    case 5:  // ncclInvalidUsage
      return "ranks disagree on the order of collective calls, or two ranks share one GPU; rerun "
             "with NCCL_DEBUG=WARN";
    case 6:  // ncclRemoteError
      return "another rank failed or went away: look for its own error message";
    default:
      return "rerun with NCCL_DEBUG=WARN for NCCL's own explanation";
  }
}

[[noreturn]] inline void nccl_fail(int code, const char* message, const char* last_error, const char* call,
                                   const char* file, int line) {
  std::string what = cat("NCCL call ", call, " failed: ", message);
  if (last_error && *last_error) what += cat(" (", last_error, ")");
  fatal(what, file, line, nccl_error_hint(code));
}

}  // namespace relay::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t relay_cuda_err_ = (call);                                                 \
    if (relay_cuda_err_ != cudaSuccess)                                                   \
      ::relay::cuda::cuda_fail(relay_cuda_err_, #call, __FILE__, __LINE__);               \
  } while (0)

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t relay_cublas_st_ = (call);                                             \
    if (relay_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::relay::cuda::cublas_fail(relay_cublas_st_, #call, __FILE__, __LINE__);            \
  } while (0)

// Needs <nccl.h> where it is used.
#define NCCL_CHECK(call)                                                                  \
  do {                                                                                    \
    ncclResult_t relay_nccl_res_ = (call);                                                \
    if (relay_nccl_res_ != ncclSuccess)                                                   \
      ::relay::cuda::nccl_fail(static_cast<int>(relay_nccl_res_),                         \
                               ncclGetErrorString(relay_nccl_res_), ncclGetLastError(nullptr), \
                               #call, __FILE__, __LINE__);                                \
  } while (0)
