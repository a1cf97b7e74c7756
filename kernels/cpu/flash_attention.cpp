// FlashAttention-2 causal self-attention on the CPU, forward and backward, float32 or bfloat16 storage
// with float32 math. Tiles of queries meet tiles of keys with an online softmax (running max and sum), so
// the (T, T) matrix never exists: only each row's log-sum-exp is saved, and the backward recomputes the
// probabilities from it. Dao et al., FlashAttention arXiv:2205.14135; Dao, FlashAttention-2
// arXiv:2307.08691 (Algorithms 1 and 2). Tile GEMMs go to oneDNN's sgemm; the softmax loops are ours.
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/simd.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace relay::cpu {

namespace {

// Tile sizes, measured at GPT-2 124M shapes (bench/bench_attention.cpp). The forward's query blocks
// are the unit of parallel work; the backward walks key blocks of kBwdKeys, each against query tiles
// of kBwdQueries rows.
constexpr int64_t kFwdQueries = 128, kFwdKeys = 128;
constexpr int64_t kBwdQueries = 128, kBwdKeys = 128;  // kFwdKeys and kBwdKeys: multiples of 16
constexpr int64_t kDiagRows = 32;  // rows per strip of a tile that crosses the diagonal

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

// The softmax loops below work on 16 floats at a time through GCC's vector extensions; RELAY_CPU_CLONES
// (simd.hpp) builds them for AVX-512, AVX2 and baseline x86-64 and picks one at load time: one zmm, two
// ymm or four xmm registers per vector. The choice depends on the machine only, never on the thread count.
// The 64-byte vectors below pass only between inline helpers of this file, never across an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

constexpr int64_t kLanes = 16;
typedef float vfloat __attribute__((vector_size(64)));  // (16)
typedef int32_t vint __attribute__((vector_size(64)));  // (16)

inline vfloat vload(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, const vfloat& v) { std::memcpy(p, &v, sizeof v); }
inline vfloat vsplat(float x) { return vfloat{} + x; }
inline vfloat vmax(const vfloat& a, const vfloat& b) { return a > b ? a : b; }
// Lanes whose column c + i lies in [lo, hi): the keys a row sees when its document starts inside the tile.
inline vint lanes_in(int64_t lo, int64_t hi, int64_t c) {
  const vint idx = vint{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15} + int32_t(c);
  return (idx >= int32_t(lo)) & (idx < int32_t(hi));
}
// Horizontal sum and max by halving (4 shuffles), rather than 15 dependent scalar operations.
inline float hsum(const vfloat& x) {
  vfloat v = x;
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}
inline float hmax(const vfloat& x) {
  vfloat v = x;
  v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
  v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
  v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
  return v[0];
}

// 2^x for x <= ~0 to ~1e-7 relative; 0 for x <= -126.5 and for -inf (no subnormals).
// x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f by its Taylor series to degree 7 (error < 1e-8),
// 2^n built in the exponent field. Clamping x at -127 makes that field 0, so 2^n = 0: no select needed
// (GCC scalarises a vector select nested in another one, as the callers' masks would make it).
// T is float or vfloat, I the matching int32 type.
template <typename T, typename I>
inline T exp2_poly(const T& in) {
  const T lowest = T{} - 127.0f;
  const T x = in > lowest ? in : lowest;
  const T magic = T{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const T t = x + magic;
  const T f = x - (t - magic);
  I ti;
  std::memcpy(&ti, &t, sizeof t);
  const I bits = (ti - 0x4b400000 + 127) << 23;
  T two_n;
  std::memcpy(&two_n, &bits, sizeof t);
  T p = T{} + 1.5252733804e-5f;
  p = p * f + 1.5403530393e-4f;
  p = p * f + 1.3333558146e-3f;
  p = p * f + 9.6181291076e-3f;
  p = p * f + 5.5504108665e-2f;
  p = p * f + 2.4022650696e-1f;
  p = p * f + 6.9314718056e-1f;
  p = p * f + 1.0f;
  return p * two_n;
}
inline float exp2_poly(float x) { return exp2_poly<float, int32_t>(x); }
inline vfloat exp2_poly(const vfloat& x) { return exp2_poly<vfloat, vint>(x); }

// Query row t of a tile sees the tile's keys [k0, k0 + valid): valid = t - k0 + 1 clamped to [0, cols].
inline int64_t visible_keys(int64_t t, int64_t k0, int64_t cols) { return std::clamp<int64_t>(t - k0 + 1, 0, cols); }
// With a document mask the row sees none of the keys before its document's first position lo: the tile's
// columns [first_visible(lo, k0), valid) are its keys (lo null: the first column).
inline int64_t first_visible(const int32_t* lo, int64_t r, int64_t k0) {
  return lo ? std::max<int64_t>(int64_t(lo[r]) - k0, 0) : 0;
}
// The key positions of a tile's query rows: first + r, or pos[r] where the queries are a subset of the keys'
// positions (context parallelism: a rank's chunks of a sequence against the whole sequence's keys).
struct Rows {
  const int32_t* pos;  // (rows) or null
  int64_t first;
  int64_t at(int64_t r) const { return pos ? int64_t(pos[r]) : first + r; }
  Rows from(int64_t r) const { return {pos ? pos + r : nullptr, first + r}; }
};

// The tile loops below run over whole vectors: a row of a tile (rows, ld) may be read and written up to
// ld, a multiple of kLanes. Rows that see every key of the tile (all tiles but the diagonal ones) take
// the loop without masks; in the others, lanes at or past a row's visible keys are written 0.

// One key tile of the forward's online softmax (FlashAttention-2 Algorithm 1, lines 8-10).
// s (rows, ld): scores of queries qr (at key positions qr.at(r)) against keys k0.., in log2 units, replaced by their unnormalised
// probabilities 2^(s - running max), masked keys 0. m, l (rows): running max and sum, updated (-inf and 0
// before a row's first key); acc (rows, hd): the output accumulator (0 before then), rescaled when a row's max
// grows. lo (rows): each row's first visible key (its document's start), or null.
RELAY_CPU_CLONES
void online_softmax_tile(float* s, int64_t ld, int64_t rows, int64_t cols, Rows qr, int64_t k0, float* m,
                         float* l, float* acc, int64_t hd, const int32_t* lo) {
  const int64_t padded = (cols + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const int64_t valid = visible_keys(qr.at(r), k0, cols), from = first_visible(lo, r, k0);
    vfloat vmx = vsplat(m[r]), vsum{};
    float mx;
    if (from >= valid) {  // the row sees none of these keys (its document starts after them)
      for (int64_t c = 0; c < padded; c += kLanes) vstore(row + c, vfloat{});
      continue;
    }
    if (valid == padded && from == 0) {
      for (int64_t c = 0; c < padded; c += kLanes) vmx = vmax(vmx, vload(row + c));
      mx = hmax(vmx);
      for (int64_t c = 0; c < padded; c += kLanes) {
        const vfloat p = exp2_poly(vload(row + c) - mx);
        vstore(row + c, p);
        vsum += p;
      }
    } else {
      for (int64_t c = 0; c < padded; c += kLanes) {
        const vfloat x = lanes_in(from, valid, c) ? vload(row + c) : vmx;
        vmx = vmax(vmx, x);
      }
      mx = hmax(vmx);  // finite: the row sees a key of this tile
      for (int64_t c = 0; c < padded; c += kLanes) {
        const vfloat p = exp2_poly(vload(row + c) - mx);
        const vfloat kept = lanes_in(from, valid, c) ? p : vfloat{};
        vstore(row + c, kept);
        vsum += kept;
      }
    }
    const float sum = hsum(vsum);
    const float corr = exp2_poly(m[r] - mx);  // 0 before the row's first key (m = -inf)
    l[r] = l[r] * corr + sum;
    if (corr != 1.0f) {
      float* a = acc + r * hd;
      for (int64_t i = 0; i < hd; ++i) a[i] *= corr;
    }
    m[r] = mx;
  }
}

// Backward, one tile (FlashAttention-2 Algorithm 2, line 11): s (rows, ld) scores in log2 units ->
// probabilities P = 2^(s - lse2) of queries qr against keys k0.., masked keys 0. lse2 (rows) the
// forward's log-sum-exp in log2 units.
RELAY_CPU_CLONES
void recompute_probs_tile(float* s, int64_t ld, int64_t rows, int64_t cols, Rows qr, int64_t k0,
                          const float* lse2, const int32_t* lo) {
  const int64_t padded = (cols + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const int64_t valid = visible_keys(qr.at(r), k0, cols), from = first_visible(lo, r, k0);
    const float shift = lse2[r];
    if (valid == padded && from == 0) {
      for (int64_t c = 0; c < padded; c += kLanes) vstore(row + c, exp2_poly(vload(row + c) - shift));
    } else {
      for (int64_t c = 0; c < padded; c += kLanes) {
        const vfloat p = exp2_poly(vload(row + c) - shift);
        vstore(row + c, lanes_in(from, valid, c) ? p : vfloat{});
      }
    }
  }
}

// Backward, softmax's gradient (Algorithm 2, line 14): dp (rows, ld) = dP -> dS = P * (dP - D), in place.
// p (rows, ld) probabilities, 0 on masked keys; d (rows) = rowsum(dO * O).
RELAY_CPU_CLONES
void softmax_grad_tile(float* dp, const float* p, int64_t ld, int64_t rows, int64_t cols, Rows qr, int64_t k0,
                       const float* d, const int32_t* lo) {
  const int64_t padded = (cols + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    float* g = dp + r * ld;
    const float* pr = p + r * ld;
    const int64_t valid = visible_keys(qr.at(r), k0, cols), from = first_visible(lo, r, k0);
    const float dr = d[r];
    if (valid == padded && from == 0) {
      for (int64_t c = 0; c < padded; c += kLanes) vstore(g + c, vload(pr + c) * (vload(g + c) - dr));
    } else {
      for (int64_t c = 0; c < padded; c += kLanes) {
        const vfloat ds = vload(pr + c) * (vload(g + c) - dr);
        vstore(g + c, lanes_in(from, valid, c) ? ds : vfloat{});
      }
    }
  }
}

// d (rows) = rowsum(a * b); a, b (rows, hd) contiguous.
RELAY_CPU_CLONES void row_dots(const float* a, const float* b, float* d, int64_t rows, int64_t hd) {
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < hd; ++i) sum += a[r * hd + i] * b[r * hd + i];
    d[r] = sum;
  }
}

// Strided rows of the storage type <-> contiguous float32 scratch. A head's slice of a row is a few
// cache lines, each row in another page, which the hardware prefetcher does not follow: rows a little
// ahead are prefetched by hand (cold qkv rows of GPT-2 124M: 10.5 instead of 9 GB/s here).
constexpr int64_t kPrefetchRows = 8;
template <typename Elem>
inline void prefetch_row(const Elem* p, int64_t cols, bool write) {
  for (int64_t byte = 0; byte < cols * int64_t(sizeof(Elem)); byte += 64)
    write ? __builtin_prefetch(reinterpret_cast<const char*>(p) + byte, 1)
          : __builtin_prefetch(reinterpret_cast<const char*>(p) + byte, 0);
}
// dst (rows, cols) = src (rows, ld) widened to float32.
template <typename Elem>
RELAY_CPU_CLONES void load_rows(const Elem* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kPrefetchRows < rows) prefetch_row(src + (r + kPrefetchRows) * ld, cols, false);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = load(src[r * ld + c]);
  }
}
// dst (rows, ld) = src (rows, cols) * scale (per row when row_scale is not null), rounded to Elem.
template <typename Elem>
RELAY_CPU_CLONES void store_rows(const float* src, const float* row_scale, int64_t rows, int64_t cols, Elem* dst,
                                 int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kPrefetchRows < rows) prefetch_row(dst + (r + kPrefetchRows) * ld, cols, true);
    const float sc = row_scale ? row_scale[r] : 1.0f;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) store(dst[r * ld + c], src[r * cols + c] * sc);
  }
}

// Called first in each parallel region: oneDNN's sgemm runs on omp_get_max_threads() threads outside an
// active parallel region, which a team of one is not. Setting this thread's own ICV to 1 keeps every tile
// GEMM on its calling thread whatever the team size, so that no tile's summation order can depend on it.
void single_threaded_gemm() { omp_set_num_threads(1); }

}  // namespace

// The kernels take q, k, v as strided row views so that GPT's packed qkv (B*T, 3C) and Llama's separate
// q (B*T, H*hd), k, v (B*T, KV*hd) share them: query head h reads key/value head h / (H / KV), and KV == H
// is plain multi-head attention (the packed op calls these with exactly its old arithmetic).
template <typename Elem>
void flash_attention_gqa_forward_at(const Elem* q_in, const Elem* k_in, const Elem* v_in, int64_t ldq, int64_t ldkv,
                                    Elem* out, float* lse, int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos,
                                    int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start, int64_t hd_v,
                                    int64_t ldv) {
  if (hd_v <= 0) hd_v = hd;
  if (ldv <= 0) ldv = ldkv;
  const int64_t C = H * hd_v, group = H / KV;  // C: out's row width
  const int64_t blocks = (Tq + kFwdQueries - 1) / kFwdQueries, heads = B * H;
  // Scores in log2 units (scale * log2 e folded into the GEMM) so that the softmax needs only 2^x.
  const float alpha = kLog2e / std::sqrt(float(hd));
#pragma omp parallel
  {
    single_threaded_gemm();
    // Per-thread float32 scratch whatever Elem is. k, v hold rows [0, cached) of key/value head cached_kv:
    // a thread usually takes several query blocks of one head (or of the heads sharing its key/value head)
    // in a row, and reads those keys once, not once per block (they fit in L2: 2 x T x hd floats, 512 KiB
    // at T = 1024, hd = 64).
    std::vector<float> k(static_cast<size_t>(Tk * hd));                 // (Tk, hd)
    std::vector<float> v(static_cast<size_t>(Tk * hd_v));               // (Tk, hd_v)
    int64_t cached_kv = -1, cached = 0;
    std::vector<float> q(static_cast<size_t>(kFwdQueries * hd));        // (Br, hd)
    std::vector<float> s(static_cast<size_t>(kFwdQueries * kFwdKeys));  // (Br, Bc) scores, then probabilities
    std::vector<float> acc(static_cast<size_t>(kFwdQueries * hd_v));    // (Br, hd_v) unnormalised output
    std::vector<float> m(static_cast<size_t>(kFwdQueries)), l(m.size()), inv_l(m.size());  // (Br)
    // Tasks are (b, h, query block), head after head and within a head the last query blocks (the most key
    // tiles) first, so that the dynamic schedule ends on small tasks. Tasks write disjoint outputs: the
    // schedule cannot change a bit.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < blocks * heads; ++task) {
      const int64_t bh = task / blocks, qb = blocks - 1 - task % blocks, b = bh / H, h = bh % H;
      const int64_t kvh = b * KV + h / group;
      const int64_t q0 = qb * kFwdQueries, q1 = std::min(Tq, q0 + kFwdQueries), rows = q1 - q0;
      const Rows qr{q_pos ? q_pos + b * Tq + q0 : nullptr, q0};  // the block's queries' key positions
      const int64_t p_end = qr.at(rows - 1) + 1;                   // keys at or after it are never seen
      const Elem* kbase = k_in + b * Tk * ldkv + (h / group) * hd;  // (Tk, ldkv) this sequence's key head
      const Elem* vbase = v_in + b * Tk * ldv + (h / group) * hd_v;  // (Tk, ldv)
      if (kvh != cached_kv) cached_kv = kvh, cached = 0;
      if (cached < p_end) {
        load_rows(kbase + cached * ldkv, ldkv, p_end - cached, hd, k.data() + cached * hd);
        load_rows(vbase + cached * ldv, ldv, p_end - cached, hd_v, v.data() + cached * hd_v);
        cached = p_end;
      }
      load_rows(q_in + (b * Tq + q0) * ldq + h * hd, ldq, rows, hd, q.data());
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      // The block's rows' first visible keys (non-decreasing), or null without a document mask.
      const int32_t* lo = doc_start ? doc_start + b * Tq + q0 : nullptr;
      // Key tiles from the one holding the block's first visible key up to the block's last query: tiles above
      // the diagonal, and before every row's document, are never touched. Below the diagonal all rows see the
      // whole tile; a tile that crosses it goes in strips of kDiagRows rows, each cut at its last query, so that
      // little of the masked triangle is computed.
      for (int64_t k0 = lo ? lo[0] / kFwdKeys * kFwdKeys : 0; k0 < p_end; k0 += kFwdKeys) {
        const int64_t k1 = std::min(p_end, k0 + kFwdKeys), strip = k1 <= qr.at(0) + 1 ? rows : kDiagRows;
        for (int64_t r0 = 0; r0 < rows; r0 += strip) {
          const int64_t r1 = std::min(rows, r0 + strip), cols = std::min(k1, qr.at(r1 - 1) + 1) - k0;
          if (cols <= 0) continue;                   // the strip's queries precede these keys
          if (lo && lo[r0] >= k1) continue;           // ... or the documents of all its rows start after them
          gemm(false, true, r1 - r0, cols, hd, alpha, q.data() + r0 * hd, hd, k.data() + k0 * hd, hd, 0.0f,
               s.data(), kFwdKeys);
          online_softmax_tile(s.data(), kFwdKeys, r1 - r0, cols, qr.from(r0), k0, m.data() + r0, l.data() + r0,
                              acc.data() + r0 * hd_v, hd_v, lo ? lo + r0 : nullptr);
          gemm(false, false, r1 - r0, hd_v, cols, 1.0f, s.data(), kFwdKeys, v.data() + k0 * hd_v, hd_v, 1.0f,
               acc.data() + r0 * hd_v, hd_v);
        }
      }
      float* lse_bh = lse + bh * Tq;  // (Tq)
      for (int64_t r = 0; r < rows; ++r) {
        inv_l[size_t(r)] = 1.0f / l[size_t(r)];
        lse_bh[q0 + r] = (m[size_t(r)] + std::log2(l[size_t(r)])) * kLn2;
      }
      store_rows(acc.data(), inv_l.data(), rows, hd_v, out + (b * Tq + q0) * C + h * hd_v, C);
    }
  }
}

template <typename Elem>
void flash_attention_gqa_forward(const Elem* q_in, const Elem* k_in, const Elem* v_in, int64_t ldq, int64_t ldkv,
                                 Elem* out, float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                 const int32_t* doc_start, int64_t hd_v, int64_t ldv) {
  flash_attention_gqa_forward_at(q_in, k_in, v_in, ldq, ldkv, out, lse, B, T, T, nullptr, H, KV, hd, doc_start, hd_v,
                                 ldv);
}

template <typename Elem>
void flash_attention_gqa_backward_at(const Elem* dout, const Elem* q_in, const Elem* k_in, const Elem* v_in,
                                     int64_t ldq, int64_t ldkv, const Elem* out, const float* lse, Elem* dq_out,
                                     Elem* dk_out, Elem* dv_out, int64_t B, int64_t Tq, int64_t Tk,
                                     const int32_t* q_pos, int64_t H, int64_t KV, int64_t hd,
                                     const int32_t* doc_start, int64_t hd_v, int64_t ldv) {
  if (hd_v <= 0) hd_v = hd;
  if (ldv <= 0) ldv = ldkv;
  const int64_t C = H * hd_v, group = H / KV;  // C: out's and dout's row width
  const float scale = 1.0f / std::sqrt(float(hd)), alpha = kLog2e * scale;
#pragma omp parallel
  {
    single_threaded_gemm();
    // Per-thread float32 copies of one head, converted once per head rather than once per tile.
    std::vector<float> q(static_cast<size_t>(Tq * hd));                   // (Tq, hd)
    std::vector<float> dO(static_cast<size_t>(Tq * hd_v));                // (Tq, hd_v)
    std::vector<float> dq(static_cast<size_t>(Tq * std::max(hd, hd_v)));  // (Tq, hd) dQ, first O (Tq, hd_v) for D
    std::vector<float> k(static_cast<size_t>(Tk * hd)), dk(k.size());     // (Tk, hd) K, dK of the key/value head
    std::vector<float> v(static_cast<size_t>(Tk * hd_v)), dv(v.size());   // (Tk, hd_v) V, dV
    std::vector<float> lse2(static_cast<size_t>(Tq)), D(lse2.size());   // (Tq)
    std::vector<float> p(static_cast<size_t>(kBwdQueries * kBwdKeys)), ds(p.size());  // (Br, Bc)
    // One task per (b, key/value head), done in a fixed order by one thread: its query heads in order, and
    // for each, dQ sums its key tiles and dK, dV sum their query tiles always in the same order, whatever
    // the thread count.
#pragma omp for schedule(dynamic, 1)
    for (int64_t bkv = 0; bkv < B * KV; ++bkv) {
      const int64_t b = bkv / KV, kvh = bkv % KV;
      load_rows(k_in + b * Tk * ldkv + kvh * hd, ldkv, Tk, hd, k.data());
      load_rows(v_in + b * Tk * ldv + kvh * hd_v, ldv, Tk, hd_v, v.data());
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      const int32_t* qp = q_pos ? q_pos + b * Tq : nullptr;            // (Tq) key positions of the queries
      const int32_t* ds0 = doc_start ? doc_start + b * Tq : nullptr;   // (Tq) first visible key of each query
      const Rows all{qp, 0};
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t bh = b * H + h;
        load_rows(q_in + b * Tq * ldq + h * hd, ldq, Tq, hd, q.data());
        load_rows(dout + b * Tq * C + h * hd_v, C, Tq, hd_v, dO.data());
        load_rows(out + b * Tq * C + h * hd_v, C, Tq, hd_v, dq.data());
        row_dots(dO.data(), dq.data(), D.data(), Tq, hd_v);  // D = rowsum(dO * O)
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t t = 0; t < Tq; ++t) lse2[size_t(t)] = lse[bh * Tq + t] * kLog2e;
        for (int64_t k0 = 0; k0 < Tk; k0 += kBwdKeys) {
          const int64_t k1 = std::min(Tk, k0 + kBwdKeys);
          float* dkt = dk.data() + k0 * hd;  // (k1 - k0, hd)
          float* dvt = dv.data() + k0 * hd_v;
          // Queries at positions before k0 see none of these keys; those at or after k1 see them all (unless their
          // document starts later). Query positions and first visible keys are non-decreasing.
          const int64_t qa = qp ? std::lower_bound(qp, qp + Tq, int32_t(k0)) - qp : std::min(k0, Tq);
          const int64_t qb = qp ? std::lower_bound(qp + qa, qp + Tq, int32_t(k1)) - qp : std::min(k1, Tq);
          // Queries whose document starts at or after k1 see none of them: the queries that do end at the end of
          // the document holding key k1 - 1.
          const int64_t q_end = ds0 ? std::lower_bound(ds0 + qa, ds0 + Tq, int32_t(k1)) - ds0 : Tq;
          // From the diagonal: strips of kDiagRows rows cut at their last query while they cross it, then whole
          // tiles of kBwdQueries rows.
          for (int64_t q0 = qa, q1; q0 < q_end; q0 = q1) {
            q1 = q0 < qb ? std::min({qb, q0 + kDiagRows, q_end}) : std::min(q_end, q0 + kBwdQueries);
            const int64_t rows = q1 - q0, cols = std::min(k1, all.at(q1 - 1) + 1) - k0;
            const float* qt = q.data() + q0 * hd;
            const float* dOt = dO.data() + q0 * hd_v;
            gemm(false, true, rows, cols, hd, alpha, qt, hd, k.data() + k0 * hd, hd, 0.0f, p.data(), kBwdKeys);
            const int32_t* lo = ds0 ? ds0 + q0 : nullptr;
            recompute_probs_tile(p.data(), kBwdKeys, rows, cols, all.from(q0), k0, lse2.data() + q0, lo);
            gemm(true, false, cols, hd_v, rows, 1.0f, p.data(), kBwdKeys, dOt, hd_v, 1.0f, dvt, hd_v);  // dV += P^T dO
            gemm(false, true, rows, cols, hd_v, 1.0f, dOt, hd_v, v.data() + k0 * hd_v, hd_v, 0.0f, ds.data(),
                 kBwdKeys);  // dP
            softmax_grad_tile(ds.data(), p.data(), kBwdKeys, rows, cols, all.from(q0), k0, D.data() + q0, lo);
            gemm(false, false, rows, hd, cols, scale, ds.data(), kBwdKeys, k.data() + k0 * hd, hd, 1.0f,
                 dq.data() + q0 * hd, hd);  // dQ += scale dS K
            gemm(true, false, cols, hd, rows, scale, ds.data(), kBwdKeys, qt, hd, 1.0f, dkt, hd);  // dK += scale dS^T Q
          }
        }
        store_rows(dq.data(), nullptr, Tq, hd, dq_out + b * Tq * ldq + h * hd, ldq);
      }
      store_rows(dk.data(), nullptr, Tk, hd, dk_out + b * Tk * ldkv + kvh * hd, ldkv);
      store_rows(dv.data(), nullptr, Tk, hd_v, dv_out + b * Tk * ldv + kvh * hd_v, ldv);
    }
  }
}

template <typename Elem>
void flash_attention_gqa_backward(const Elem* dout, const Elem* q_in, const Elem* k_in, const Elem* v_in, int64_t ldq,
                                  int64_t ldkv, const Elem* out, const float* lse, Elem* dq_out, Elem* dk_out,
                                  Elem* dv_out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                  const int32_t* doc_start, int64_t hd_v, int64_t ldv) {
  flash_attention_gqa_backward_at(dout, q_in, k_in, v_in, ldq, ldkv, out, lse, dq_out, dk_out, dv_out, B, T, T,
                                  nullptr, H, KV, hd, doc_start, hd_v, ldv);
}

// GPT's packed qkv (B*T, 3C): q at column 0, k at C, v at 2C, every row 3C apart; KV == H.
template <typename Elem>
void flash_attention_forward(const Elem* qkv, Elem* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H,
                             const int32_t* doc_start) {
  flash_attention_gqa_forward(qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, out, lse, B, T, H, H, C / H, doc_start);
}
template <typename Elem>
void flash_attention_backward(const Elem* dout, const Elem* qkv, const Elem* out, const float* lse, Elem* dqkv,
                              int64_t B, int64_t T, int64_t C, int64_t H, const int32_t* doc_start) {
  flash_attention_gqa_backward(dout, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, out, lse, dqkv, dqkv + C, dqkv + 2 * C,
                               B, T, H, H, C / H, doc_start);
}

#define INST(E)                                                                                                    \
  template void flash_attention_forward<E>(const E*, E*, float*, int64_t, int64_t, int64_t, int64_t, const int32_t*); \
  template void flash_attention_backward<E>(const E*, const E*, const E*, const float*, E*, int64_t, int64_t,       \
                                            int64_t, int64_t, const int32_t*);                                     \
  template void flash_attention_gqa_forward<E>(const E*, const E*, const E*, int64_t, int64_t, E*, float*, int64_t, \
                                               int64_t, int64_t, int64_t, int64_t, const int32_t*, int64_t, int64_t); \
  template void flash_attention_gqa_backward<E>(const E*, const E*, const E*, const E*, int64_t, int64_t, const E*, \
                                                const float*, E*, E*, E*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                                const int32_t*, int64_t, int64_t);                                  \
  template void flash_attention_gqa_forward_at<E>(const E*, const E*, const E*, int64_t, int64_t, E*, float*,       \
                                                  int64_t, int64_t, int64_t, const int32_t*, int64_t, int64_t,      \
                                                  int64_t, const int32_t*, int64_t, int64_t);                       \
  template void flash_attention_gqa_backward_at<E>(const E*, const E*, const E*, const E*, int64_t, int64_t,        \
                                                   const E*, const float*, E*, E*, E*, int64_t, int64_t, int64_t,   \
                                                   const int32_t*, int64_t, int64_t, int64_t, const int32_t*,       \
                                                   int64_t, int64_t);
INST(float)
INST(bf16)
#undef INST

}  // namespace relay::cpu
