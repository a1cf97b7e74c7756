// The reduce-scatter's local sum of the exchanged pieces in the binomial tree's grouping.
#include "comm/reduce_scatter.hpp"

#include <cstring>

#include "core/bf16.hpp"
#include "core/error.hpp"

namespace relay {

namespace {
template <class T, class Add>
void tree_sum(T* pieces, T* out, int size, int64_t count, Add add) {
  auto block = [&](int i) { return pieces + int64_t(i) * count; };
  if (size == 1) {
    std::memcpy(out, block(0), size_t(count) * sizeof(T));
    return;
  }
  // Round r (stride = 2^(r-1)): member i (i divisible by 2 stride) takes member i + stride's partial sum. The last
  // round, which leaves member 0 holding everything, writes straight into out.
  for (int stride = 1; stride < size; stride *= 2) {
    const bool last = 2 * stride >= size;
    for (int i = 0; i + stride < size; i += 2 * stride) {
      const T* a = block(i);
      const T* b = block(i + stride);
      T* dst = last ? out : block(i);
      for (int64_t k = 0; k < count; ++k) dst[k] = add(a[k], b[k]);
    }
  }
}
}  // namespace

void sum_pieces(void* pieces, void* out, int size, int64_t count, DType dtype) {
  switch (dtype) {
    case DType::f32:
      tree_sum(static_cast<float*>(pieces), static_cast<float*>(out), size, count,
               [](float a, float b) { return a + b; });
      return;
    case DType::bf16:
      tree_sum(static_cast<bf16*>(pieces), static_cast<bf16*>(out), size, count,
               bf16_add);
      return;
    case DType::i32:
      tree_sum(static_cast<int32_t*>(pieces), static_cast<int32_t*>(out), size, count,
               [](int32_t a, int32_t b) { return int32_t(a + b); });
      return;
    default: RELAY_ASSERT(false, "a reduce-scatter sums f32, bf16 or i32 only, not " << dtype_name(dtype));
  }
}

}  // namespace relay
