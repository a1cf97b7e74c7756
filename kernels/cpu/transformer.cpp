// CPU reference kernels of GPT-2 (llm.c's train_gpt2.c is the model for the loops): token + position
// embedding and its deterministic backward, causal multi-head self-attention forward/backward with the
// softmax probabilities saved, and one decoding step with a key-value cache. Parallel loops split
// work so that every output element is accumulated by one thread in a fixed order: the results do not
// depend on the thread count.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/cpu/instantiate.hpp"
#include "kernels/cpu/simd.hpp"

namespace relay::cpu {

template <typename X>
RELAY_CPU_CLONES
void embedding_forward(const int32_t* tokens, const X* wte, const X* wpe, X* out, int64_t rows, int64_t C, int64_t T,
                       int64_t vocab_start, int64_t vocab_rows, const int32_t* positions) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t v = int64_t(tokens[r]) - vocab_start;
    const X* e = v >= 0 && v < vocab_rows ? wte + v * C : nullptr;  // another tp rank's token: 0
    const X* p = wpe ? wpe + (positions ? int64_t(positions[r]) : r % T) * C : nullptr;
    X* o = out + r * C;
    for (int64_t c = 0; c < C; ++c) store(o[c], (e ? load(e[c]) : 0.0f) + (p ? load(p[c]) : 0.0f));
  }
}

template <typename X>
RELAY_CPU_CLONES
void embedding_backward(const int32_t* tokens, const X* dout, float* dwte, float* dwpe, int64_t rows, int64_t C,
                        int64_t T, int64_t vocab_start, int64_t vocab_rows, const int32_t* positions) {
  // Each thread owns a range of channels and visits the rows in order: no two threads write one element.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
    for (int64_t r = 0; r < rows; ++r) {
      const X* d = dout + r * C;
      const int64_t v = int64_t(tokens[r]) - vocab_start;
      if (v >= 0 && v < vocab_rows) {
        float* e = dwte + v * C;
        for (int64_t c = c0; c < c1; ++c) e[c] += load(d[c]);
      }
      if (dwpe) {
        float* p = dwpe + (positions ? int64_t(positions[r]) : r % T) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += load(d[c]);
      }
    }
  }
}

void attention_forward(const float* qkv, float* att, float* out, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * C3 + h * hd;
        float* a = att + ((b * H + h) * T + t) * T;  // (T) row t of this head's probabilities
        float mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = qkv + (b * T + s) * C3 + C + h * hd;
          float dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
          a[s] = dot * scale;
          mx = std::max(mx, a[s]);
        }
        float sum = 0;
        for (int64_t s = 0; s <= t; ++s) sum += (a[s] = std::exp(a[s] - mx));
        const float inv = 1.0f / sum;
        for (int64_t s = 0; s <= t; ++s) a[s] *= inv;
        for (int64_t s = t + 1; s < T; ++s) a[s] = 0;
        float* o = out + (b * T + t) * C + h * hd;
        for (int64_t i = 0; i < hd; ++i) o[i] = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = qkv + (b * T + s) * C3 + 2 * C + h * hd;
          for (int64_t i = 0; i < hd; ++i) o[i] += a[s] * v[i];
        }
      }
    }
}

void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, int64_t B, int64_t T,
                        int64_t C, int64_t H) {
  const int64_t hd = C / H, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel
  {
    std::vector<float> datt(static_cast<size_t>(T)), dpre(static_cast<size_t>(T));  // (T) scratch rows
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t)  // this (b, h) owns these columns of dq, dk and dv
          for (int64_t part = 0; part < 3; ++part) {
            float* d = dqkv + (b * T + t) * C3 + part * C + h * hd;
            for (int64_t i = 0; i < hd; ++i) d[i] = 0;
          }
        for (int64_t t = 0; t < T; ++t) {
          const float* a = att + ((b * H + h) * T + t) * T;
          const float* dy = dout + (b * T + t) * C + h * hd;
          const float* q = qkv + (b * T + t) * C3 + h * hd;
          float* dq = dqkv + (b * T + t) * C3 + h * hd;
          // out = att @ v: d att and d v.
          for (int64_t s = 0; s <= t; ++s) {
            const float* v = qkv + (b * T + s) * C3 + 2 * C + h * hd;
            float* dv = dqkv + (b * T + s) * C3 + 2 * C + h * hd;
            float dot = 0;
            for (int64_t i = 0; i < hd; ++i) {
              dot += dy[i] * v[i];
              dv[i] += a[s] * dy[i];
            }
            datt[static_cast<size_t>(s)] = dot;
          }
          // softmax: d pre = att * (d att - sum(att * d att)).
          float inner = 0;
          for (int64_t s = 0; s <= t; ++s) inner += a[s] * datt[static_cast<size_t>(s)];
          for (int64_t s = 0; s <= t; ++s) dpre[static_cast<size_t>(s)] = a[s] * (datt[static_cast<size_t>(s)] - inner);
          // pre = scale q . k: d q and d k.
          for (int64_t s = 0; s <= t; ++s) {
            const float* k = qkv + (b * T + s) * C3 + C + h * hd;
            float* dk = dqkv + (b * T + s) * C3 + C + h * hd;
            const float g = dpre[static_cast<size_t>(s)] * scale;
            for (int64_t i = 0; i < hd; ++i) {
              dq[i] += g * k[i];
              dk[i] += g * q[i];
            }
          }
        }
      }
  }
}

// Query head h reads key/value head h / (H / KV); the caches hold KV heads (n, Tmax, KV*hd).
template <typename X>
RELAY_CPU_CLONES
void attention_decode_gqa(const X* q_in, int64_t ldq, const X* k_in, const X* v_in, int64_t ldkv, X* kcache,
                          X* vcache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t H, int64_t KV, int64_t hd) {
  const int64_t C = H * hd, Ckv = KV * hd, group = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t b = 0; b < n; ++b) {
    X* kc = kcache + b * Tmax * Ckv;
    X* vc = vcache + b * Tmax * Ckv;
    for (int64_t c = 0; c < Ckv; ++c) {
      kc[t * Ckv + c] = k_in[b * ldkv + c];
      vc[t * Ckv + c] = v_in[b * ldkv + c];
    }
    std::vector<float> a(static_cast<size_t>(t + 1)), o(static_cast<size_t>(hd));
    for (int64_t h = 0; h < H; ++h) {
      const X* q = q_in + b * ldq + h * hd;
      const int64_t kvo = (h / group) * hd;  // this head's key/value columns
      float mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        const X* k = kc + s * Ckv + kvo;
        float dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += load(q[i]) * load(k[i]);
        a[static_cast<size_t>(s)] = dot * scale;
        mx = std::max(mx, a[static_cast<size_t>(s)]);
      }
      float sum = 0;
      for (int64_t s = 0; s <= t; ++s) sum += (a[static_cast<size_t>(s)] = std::exp(a[static_cast<size_t>(s)] - mx));
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < hd; ++i) o[static_cast<size_t>(i)] = 0;
      for (int64_t s = 0; s <= t; ++s) {
        const X* v = vc + s * Ckv + kvo;
        const float p = a[static_cast<size_t>(s)] * inv;
        for (int64_t i = 0; i < hd; ++i) o[static_cast<size_t>(i)] += p * load(v[i]);
      }
      for (int64_t i = 0; i < hd; ++i) store(out[b * C + h * hd + i], o[static_cast<size_t>(i)]);
    }
  }
}

template <typename X>
void attention_decode_latent(const X* q_in, const X* kv, X* cache, X* out, int64_t n, int64_t t, int64_t Tmax,
                             int64_t H, int64_t dk, int64_t r, float scale) {
  for (int64_t b = 0; b < n; ++b) {
    X* cb = cache + b * Tmax * dk;  // (Tmax, dk) this sequence's [latent | rotary key] per position
    for (int64_t c = 0; c < dk; ++c) cb[t * dk + c] = kv[b * dk + c];
    std::vector<float> a(static_cast<size_t>(t + 1)), o(static_cast<size_t>(r));
    for (int64_t h = 0; h < H; ++h) {
      const X* q = q_in + b * H * dk + h * dk;  // (dk) [q_latent | q_pe]
      float mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        const X* k = cb + s * dk;
        float dot = 0;
        for (int64_t i = 0; i < dk; ++i) dot += load(q[i]) * load(k[i]);
        a[static_cast<size_t>(s)] = dot * scale;
        mx = std::max(mx, a[static_cast<size_t>(s)]);
      }
      float sum = 0;
      for (int64_t s = 0; s <= t; ++s) sum += (a[static_cast<size_t>(s)] = std::exp(a[static_cast<size_t>(s)] - mx));
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < r; ++i) o[static_cast<size_t>(i)] = 0;
      for (int64_t s = 0; s <= t; ++s) {  // the values are the cached latents themselves
        const X* v = cb + s * dk;
        const float p = a[static_cast<size_t>(s)] * inv;
        for (int64_t i = 0; i < r; ++i) o[static_cast<size_t>(i)] += p * load(v[i]);
      }
      for (int64_t i = 0; i < r; ++i) store(out[b * H * r + h * r + i], o[static_cast<size_t>(i)]);
    }
  }
}

// GPT's packed qkv (n, 3C): q, k, v at columns 0, C, 2C of rows 3C apart; KV == H.
template <typename X>
void attention_decode(const X* qkv, X* kcache, X* vcache, X* out, int64_t n, int64_t t, int64_t Tmax, int64_t C,
                      int64_t H) {
  attention_decode_gqa(qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, kcache, vcache, out, n, t, Tmax, H, H, C / H);
}

#define INST(X)                                                                                                   \
  template void embedding_forward<X>(const int32_t*, const X*, const X*, X*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, const int32_t*);                                                    \
  template void embedding_backward<X>(const int32_t*, const X*, float*, float*, int64_t, int64_t, int64_t, int64_t, \
                                      int64_t, const int32_t*);                                                   \
  template void attention_decode<X>(const X*, X*, X*, X*, int64_t, int64_t, int64_t, int64_t, int64_t);       \
  template void attention_decode_gqa<X>(const X*, int64_t, const X*, const X*, int64_t, X*, X*, X*, int64_t,   \
                                        int64_t, int64_t, int64_t, int64_t, int64_t);                  \
  template void attention_decode_latent<X>(const X*, const X*, X*, X*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                           int64_t, float);
RELAY_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cpu
