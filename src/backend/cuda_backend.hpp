// The CUDA backend: cuBLASLt GEMMs and the kernels in kernels/cuda, all on one stream per backend,
// with a caching device allocator. Tested op by op against the CPU backend (tests/test_backend_ops).
// No CUDA header here: code above the backend only sees the Backend interface.
#pragma once
#include <memory>

#include "backend/backend.hpp"

namespace relay {

// The CUDA backend on device opts.gpu. Throws relay::Error when no CUDA device is visible or the
// index is out of range; library failures after that end the job (relay::fatal).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

// Number of visible CUDA devices; 0 when there is no driver or no device (never aborts).
int cuda_device_count_impl();

}  // namespace relay
