// Backend factory: the only place that knows which backends were compiled in.
#include "backend/backend.hpp"

#include "backend/cpu_backend.hpp"
#ifdef RELAY_HAVE_CUDA
#include "backend/cuda_backend.hpp"
#endif

namespace relay {

int cuda_device_count() {
#ifdef RELAY_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  std::unique_ptr<Backend> b;
  if (opts.device == Device::cpu) {
    b = std::make_unique<CpuBackend>(opts.threads);
  } else {
#ifdef RELAY_HAVE_CUDA
    b = make_cuda_backend(opts);
#else
    throw Error("train.device = \"cuda\" but this relay was built without the CUDA backend "
                "(hint: rebuild with -DRELAY_CUDA=ON on a machine with the CUDA toolkit and NCCL)");
#endif
  }
  b->set_precision(opts.precision);
  return b;
}

}  // namespace relay
