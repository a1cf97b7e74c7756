// Backend factory: the only place that knows which backends were compiled in.
#include "backend/backend.hpp"

#include "backend/cpu_backend.hpp"
#ifdef RELAY_HAVE_CUDA
#include "backend/cuda_backend.hpp"
#endif

#include <chrono>
#include <vector>

namespace relay {

namespace detail {
struct HostMarks {
  std::vector<double> t;  // seconds on the steady clock
};
}  // namespace detail

Backend::Backend() : host_marks_(std::make_unique<detail::HostMarks>()) {}
Backend::~Backend() = default;

int64_t Backend::timing_mark() {
  host_marks_->t.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return static_cast<int64_t>(host_marks_->t.size()) - 1;
}
double Backend::mark_seconds(int64_t mark) {
  const auto& t = host_marks_->t;
  RELAY_ASSERT(mark >= 0 && static_cast<size_t>(mark) < t.size(), "timing mark " << mark << " of " << t.size());
  return t[static_cast<size_t>(mark)] - t.front();
}
void Backend::clear_marks() { host_marks_->t.clear(); }

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
