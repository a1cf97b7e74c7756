// Merging two partial attentions over disjoint key sets (the online softmax's rescaling, FlashAttention
// arXiv:2205.14135 Algorithm 1; FlashAttention-2 arXiv:2307.08691 sec. 3.1), for context parallelism's local and
// remote keys. Each (row, head) is independent: the same bits whatever the thread count.
#include "kernels/cpu/attention_merge.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/instantiate.hpp"

namespace relay::cpu {

template <typename Elem>
void attention_merge(Elem* out, float* lse, const Elem* out2, const float* lse2, int64_t B, int64_t T, int64_t H,
                     int64_t hd) {
  const int64_t C = H * hd;  // out's row width
#pragma omp parallel for schedule(static) if (B * H * T * hd > 65536)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < T; ++t) {
      const float l1 = lse[bh * T + t], l2 = lse2[bh * T + t];
      Elem* o1 = out + (b * T + t) * C + h * hd;         // (hd)
      const Elem* o2 = out2 + (b * T + t) * C + h * hd;  // (hd)
      if (l2 == -INFINITY) continue;                      // set 2 adds nothing to this row
      if (l1 == -INFINITY) {                              // set 1 adds nothing: out2 as it is
        for (int64_t i = 0; i < hd; ++i) o1[i] = o2[i];
        lse[bh * T + t] = l2;
        continue;
      }
      const float mx = std::max(l1, l2), l = mx + std::log(std::exp(l1 - mx) + std::exp(l2 - mx));
      const float w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
      for (int64_t i = 0; i < hd; ++i) store(o1[i], w1 * load(o1[i]) + w2 * load(o2[i]));
      lse[bh * T + t] = l;
    }
  }
}

#define INST(E) template void attention_merge<E>(E*, float*, const E*, const float*, int64_t, int64_t, int64_t, int64_t);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
