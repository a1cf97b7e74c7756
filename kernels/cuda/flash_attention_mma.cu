// FlashAttention-2 (Dao arXiv:2307.08691, Algorithms 1 and 2) on the tensor cores: warp-level
// mma.sync.m16n8k16 with bf16 operands and float accumulators, head size HD in {64, 128}.
//   forward: one block of 4 warps per (b, h, 64 queries); warp w owns queries 16w .. 16w + 15 of the tile.
//     For each tile of 64 keys (in shared memory): S = Q K^T (16 x 64 per warp, in registers), the online
//     softmax on S's rows, O += P V with P taken from S's registers as the A operand (rounded to bf16).
//   backward: dQ and dK/dV in two kernels, so that every output element has one owner (no atomics):
//     dQ:    one block per (b, h, 64 queries), walking key tiles: S = Q K^T, P = exp2(S scale2 - lse2),
//            dP = dO V^T, dS = P (dP - D), dQ += dS K.
//     dK/dV: one block per (b, kv head, 64 keys), warp w owning keys 16w .. 16w + 15, walking its query heads
//            in order and their query tiles that see the keys: S^T = K Q^T, P^T, dP^T = V dO^T,
//            dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
// Fragment layouts of m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane / 4, c = lane % 4:
//   A (16 x 16, row-major): a0 = rows g, cols 2c..2c+1; a1 = row g + 8; a2 = row g, cols + 8; a3 = row g + 8, cols + 8
//   B (16 x 8):             b0 = rows (k) 2c..2c+1, col (n) g; b1 = rows + 8
//   C (16 x 8, float):      c0, c1 = row g, cols 2c, 2c + 1; c2, c3 = row g + 8
// so a C fragment pair (n-tiles 2j, 2j + 1) of S is, packed to bf16, the A fragment of P for keys 16j .. 16j + 15.
// Tiles sit in shared memory as rows of HD bf16 padded to HD + 8 (16 bytes more): the 8 rows a fragment load
// touches start 4 banks apart, free of bank conflicts, and every row is 16-byte aligned for ldmatrix. Every fragment
// is one ldmatrix.x4 (an A fragment, or the B fragments of two n-tiles). The tiles a block walks through (key tiles
// of the forward and dQ, query tiles of dK/dV) come in two stages by cp.async: the next tile is in flight while
// the current one is used.
#include "kernels/cuda/flash_attention_mma.cuh"

#include <climits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"

namespace relay::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // queries of a forward / dQ block, keys of a dK/dV block
constexpr int kForwardKeys = 64;    // keys of a forward tile
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

__device__ inline uint32_t pack_bf16(float lo, float hi) {  // lo in the low half: the lower index
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// c (16 x 8) += a (16 x 16) b (16 x 8)
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One ldmatrix.x4: lanes 8i .. 8i + 7 give the row addresses of 8 x 8 matrix i; lane l receives, of each matrix, row
// l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 (.trans: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1), in r[i].
template <bool TRANS>
__device__ inline void ldmatrix_x4(const bf16* p, uint32_t (&r)[4]) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// A fragment of rows r0 .. r0 + 15, columns c0 .. c0 + 15 of the shared tile s (rows LD apart): matrices (rows 0..7,
// cols 0..7) = a0, (rows 8..15, cols 0..7) = a1, (rows 0..7, cols 8..15) = a2, (rows 8..15, cols 8..15) = a3, so lane l
// addresses row l % 16 at column 8 (l / 16).
template <int LD>
__device__ inline void load_a(const bf16* s, int r0, int c0, uint32_t (&a)[4]) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4<false>(s + (r0 + lane % 16) * LD + c0 + (lane / 16) * 8, a);
}

// Two B fragments B[k][n] = s[n0 + n][k0 + k] for n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]): the tile's rows are
// B's columns (K in Q K^T, V in dO V^T, Q and dO in the dK/dV products). b0 of n-tile n0 is row n0 + g, columns
// k0 + 2c, + 1 of s: matrix (rows n0..n0+7, cols k0..k0+7); b1 the columns k0 + 8..; then the rows n0 + 8...
template <int LD>
__device__ inline void load_b_rows_x2(const bf16* s, int n0, int k0, uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, i = lane / 8;
  ldmatrix_x4<false>(s + (n0 + lane % 8 + (i >> 1) * 8) * LD + k0 + (i & 1) * 8, b);
}

// Two B fragments B[k][n] = s[k0 + k][n0 + n] for n-tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]): the tile's
// rows are B's rows (V in P V, K in dS K, dO and Q in the dK/dV products), by ldmatrix.x4.trans. Lanes 8i .. 8i + 7
// address matrix i's rows: i = 0: rows k0 + 0..7, columns n0; 1: rows k0 + 8..15, n0; 2: k0 + 0..7, n0 + 8; 3: k0 + 8..15,
// n0 + 8. Transposed, lane l receives rows 2c, 2c + 1 of column g of each: b0 and b1 of the two n-tiles.
template <int LD>
__device__ inline void load_b_cols_x2(const bf16* s, int k0, int n0, uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, i = lane / 8, r = lane % 8;
  ldmatrix_x4<true>(s + (k0 + r + (i & 1) * 8) * LD + n0 + (i >> 1) * 8, b);
}

// 16 bytes global -> shared without passing through registers (cp.async, sm_80); `valid` false writes zeros and
// reads nothing (src-size 0), src then only has to be a mapped address.
__device__ inline void cp_async16(bf16* dst, const bf16* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N of this thread's committed groups are still in flight (then __syncthreads for everyone's).
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts dst (ROWS, HD + 8) = rows [t0, t0 + ROWS) of src (T, ld), columns [0, HD); zeros beyond T. 16-byte
// asynchronous copies, part of the caller's next cp_async_commit group.
template <int HD, int ROWS>
__device__ inline void load_tile_async(const bf16* src, int64_t ld, int t0, int T, bf16* dst) {
  constexpr int kVecs = HD / 8;  // 16-byte vectors per row
  for (int i = threadIdx.x; i < ROWS * kVecs; i += kThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 8, t = t0 + r;
    cp_async16(dst + r * (HD + 8) + c, src + (t < T ? int64_t(t) * ld + c : 0), t < T);
  }
}

// Starts key tile k0's copies (BN rows of keys, then BN of their values) into one stage.
template <int HD, int BN>
__device__ inline void load_key_tile(const bf16* kseq, const bf16* vseq, int64_t ldkv, int k0, int T, bf16* stage) {
  load_tile_async<HD, BN>(kseq, ldkv, k0, T, stage);
  load_tile_async<HD, BN>(vseq, ldkv, k0, T, stage + BN * (HD + 8));
}

// Key tiles in two stages (the forward and dQ kernels): key tile k0 and its values are, or are being, copied into
// stage `cur` (BN rows of keys, then BN of values); starts tile k0 + BN's copies into the other stage when the block
// needs it (k0 + BN <= last), then waits for this thread's copies of tile k0. A __syncthreads must follow before
// the tile is read, and one must precede the call: the other stage was the previous tile's.
template <int HD, int BN>
__device__ inline const bf16* next_key_tile(const bf16* kseq, const bf16* vseq, int64_t ldkv, int k0, int last, int T,
                                            bf16* stages, int cur) {
  constexpr int LD = HD + 8;
  if (k0 + BN <= last) {
    load_key_tile<HD, BN>(kseq, vseq, ldkv, k0 + BN, T, stages + (cur ^ 1) * 2 * BN * LD);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's group is complete, the next one's may still be in flight
  } else {
    cp_async_wait<0>();
  }
  return stages + cur * 2 * BN * LD;
}

// Scores over the head dimension for a warp's 16 rows r0.. of tile a, against tile b whose rows are the columns:
// x (16 x 8N) = a b^T (S = Q K^T in the forward and dQ, dP = dO V^T; S^T = K Q^T and dP^T = V dO^T in dK/dV).
template <int LD, int KS, int N>
__device__ inline void scores(const bf16* a, int r0, const bf16* b, float (&x)[N][4]) {
#pragma unroll
  for (int nt = 0; nt < N; ++nt) x[nt][0] = x[nt][1] = x[nt][2] = x[nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t f[4];
    load_a<LD>(a, r0, 16 * ks, f);
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      uint32_t bb[4];
      load_b_rows_x2<LD>(b, 16 * np, 16 * ks, bb);
      mma(x[2 * np], f, bb[0], bb[1]);
      mma(x[2 * np + 1], f, bb[2], bb[3]);
    }
  }
}

// The A fragment of keys (or queries) 16 kc .. 16 kc + 15 from C fragments x (n-tiles of 8), packed to bf16.
template <int N>
__device__ inline void a_from_c(const float (&x)[N][4], int kc, uint32_t (&a)[4]) {
  a[0] = pack_bf16(x[2 * kc][0], x[2 * kc][1]);
  a[1] = pack_bf16(x[2 * kc][2], x[2 * kc][3]);
  a[2] = pack_bf16(x[2 * kc + 1][0], x[2 * kc + 1][1]);
  a[3] = pack_bf16(x[2 * kc + 1][2], x[2 * kc + 1][3]);
}

// acc (16 x HD) += p (16 x 16 KC, C fragments of a warp's rows, rounded to bf16) @ tile rows [0, 16 KC): O += P V in
// the forward, dQ += dS K, dV += P^T dO and dK += dS^T Q.
template <int LD, int KC, int N, int DT>
__device__ inline void accumulate(const float (&p)[N][4], const bf16* tile, float (&acc)[DT][4]) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    uint32_t a[4];
    a_from_c(p, kc, a);
#pragma unroll
    for (int dd = 0; dd < DT / 2; ++dd) {
      uint32_t bb[4];
      load_b_cols_x2<LD>(tile, 16 * kc, 16 * dd, bb);
      mma(acc[2 * dd], a, bb[0], bb[1]);
      mma(acc[2 * dd + 1], a, bb[2], bb[3]);
    }
  }
}

// kernels ---------------------------------------------------------------------------------------

// --- forward ------------------------------------------------------------------------------------

// grid (B*H, ceil(T / 64)), block 128, dynamic shared memory (64 + 2 x 2 x 64) x (HD + 8) bf16.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv, bf16* out,
                       float* lse, int T, int H, int KV, const int32_t* doc_start) {
  constexpr int LD = HD + 8, BN = kForwardKeys, NT = BN / 8, KS = HD / 16, DT = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);  // (64, LD) this block's queries
  bf16* kv_s = q_s + kRows * LD;              // two stages of [(BN, LD) a key tile, (BN, LD) its values]
  const int bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / KV), C = H * HD;
  const int q0 = blockIdx.y * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, c4 = lane % 4;
  const int wrow = q0 + 16 * warp;                         // the warp's first query
  const int rows[2] = {wrow + lane / 4, wrow + lane / 4 + 8};  // this thread's two queries
  const bf16* qseq = q + int64_t(b) * T * ldq + int64_t(h) * HD;      // (T, ldq)
  const bf16* kseq = k + int64_t(b) * T * ldkv + int64_t(kvh) * HD;   // (T, ldkv)
  const bf16* vseq = v + int64_t(b) * T * ldkv + int64_t(kvh) * HD;
  const float scale2 = kLog2e / sqrtf(float(HD));  // scores in log2 units: the softmax uses exp2
  // Document mask: each row's first visible key, the warp's smallest (documents are contiguous: its first row's).
  const int32_t* ds = doc_start ? doc_start + int64_t(b) * T : nullptr;  // (T)
  const int lo[2] = {ds && rows[0] < T ? ds[rows[0]] : 0, ds && rows[1] < T ? ds[rows[1]] : 0};
  const int wlo = ds && wrow < T ? ds[wrow] : 0;

  float o[DT][4];  // (16 x HD) of the warp's output, unnormalised
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // per row: running max (log2 units), partial sum
  const int q_last = min(T, q0 + kRows) - 1;
  // Key tiles before the block's first document start are never loaded. Two stages: tile i + 1's copies are in
  // flight while tile i is used. The first group holds the queries too.
  const int k_first = ds ? ds[q0] / BN * BN : 0;
  load_tile_async<HD, kRows>(qseq, ldq, q0, T, q_s);
  load_key_tile<HD, BN>(kseq, vseq, ldkv, k_first, T, kv_s);
  cp_async_commit();
  for (int k0 = k_first, st = 0; k0 <= q_last; k0 += BN, st ^= 1) {
    __syncthreads();  // every warp is done with the previous tile, whose stage the next copies overwrite
    const bf16* k_s = next_key_tile<HD, BN>(kseq, vseq, ldkv, k0, q_last, T, kv_s, st);  // (BN, LD) the key tile
    const bf16* v_s = k_s + BN * LD;                                                     // (BN, LD) its values
    __syncthreads();
    if (k0 > wrow + 15) continue;  // every key of the tile is after every query of the warp
    if (k0 + BN <= wlo) continue;  // ... or before every query's document
    float s[NT][4];                // (16 x BN) scores
    scores<LD, KS>(q_s, 16 * warp, k_s, s);
    // Scale, mask (keys after the query, keys beyond T, keys before the query's document), row max over the
    // quad that shares a row.
    const bool edge = ds || k0 + BN - 1 > wrow || k0 + BN > T;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = k0 + 8 * nt + 2 * c4 + (j & 1);
        float x = s[nt][j] * scale2;
        if (edge && (key > rows[j / 2] || key >= T || key < lo[j / 2])) x = -INFINITY;
        s[nt][j] = x;
        mx[j / 2] = fmaxf(mx[j / 2], x);
      }
    float corr[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      // -inf only while a row has seen no key (its document starts after this tile's keys); every row sees
      // its own key, so m ends finite. shift stands in for -inf so that no inf - inf is formed.
      const float m_new = fmaxf(m[r], mx[r]);
      shift[r] = m_new == -INFINITY ? 0.0f : m_new;
      corr[r] = exp2f(m[r] - shift[r]);  // 0 while m = -inf
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = exp2f(s[nt][j] - shift[j / 2]);  // 0 for a masked key
        s[nt][j] = p;
        l[j / 2] += p;
      }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }
    accumulate<LD, BN / 16>(s, v_s, o);  // O += P V
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = rows[r];
    if (t >= T) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = out + (int64_t(b) * T + t) * C + int64_t(h) * HD + 2 * c4;  // (HD) of row t, this lane's columns
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(dst + 8 * dt) = pack_bf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (c4 == 0) lse[int64_t(bh) * T + t] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// --- backward -----------------------------------------------------------------------------------

// grid (B*H, ceil(T / 64)), block 128, dynamic shared memory (2 x 64 + 2 x 2 x BN) x (HD + 8) bf16.
template <int HD, int BN>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv,
                  const float* lse, const float* row_dot, bf16* dq, int T, int H, int KV, const int32_t* doc_start) {
  constexpr int LD = HD + 8, NT = BN / 8, KS = HD / 16, DT = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);  // (64, LD) this block's queries
  bf16* do_s = q_s + kRows * LD;              // (64, LD) their output gradients
  bf16* kv_s = do_s + kRows * LD;             // two stages of [(BN, LD) a key tile, (BN, LD) its values]
  const int bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / KV), C = H * HD;
  const int q0 = blockIdx.y * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, c4 = lane % 4;
  const int wrow = q0 + 16 * warp;
  const int rows[2] = {wrow + lane / 4, wrow + lane / 4 + 8};
  const bf16* qseq = q + int64_t(b) * T * ldq + int64_t(h) * HD;
  const bf16* dseq = dout + int64_t(b) * T * C + int64_t(h) * HD;  // (T, C)
  const bf16* kseq = k + int64_t(b) * T * ldkv + int64_t(kvh) * HD;
  const bf16* vseq = v + int64_t(b) * T * ldkv + int64_t(kvh) * HD;
  const float scale = 1.0f / sqrtf(float(HD)), scale2 = kLog2e / sqrtf(float(HD));

  const int32_t* ds = doc_start ? doc_start + int64_t(b) * T : nullptr;  // (T) document starts
  const int lo[2] = {ds && rows[0] < T ? ds[rows[0]] : 0, ds && rows[1] < T ? ds[rows[1]] : 0};
  const int wlo = ds && wrow < T ? ds[wrow] : 0;
  float lse2[2], drow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = rows[r] < T ? lse[int64_t(bh) * T + rows[r]] * kLog2e : 0.0f;
    drow[r] = rows[r] < T ? row_dot[int64_t(bh) * T + rows[r]] : 0.0f;
  }
  float acc[DT][4];  // (16 x HD) dQ of the warp's queries, before the scale
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  const int q_last = min(T, q0 + kRows) - 1;
  // Two stages, as in the forward: the first group holds the queries and their output gradients too.
  const int k_first = ds ? ds[q0] / BN * BN : 0;
  load_tile_async<HD, kRows>(qseq, ldq, q0, T, q_s);
  load_tile_async<HD, kRows>(dseq, C, q0, T, do_s);
  load_key_tile<HD, BN>(kseq, vseq, ldkv, k_first, T, kv_s);
  cp_async_commit();
  for (int k0 = k_first, st = 0; k0 <= q_last; k0 += BN, st ^= 1) {
    __syncthreads();  // every warp is done with the previous tile, whose stage the next copies overwrite
    const bf16* k_s = next_key_tile<HD, BN>(kseq, vseq, ldkv, k0, q_last, T, kv_s, st);  // (BN, LD) the key tile
    const bf16* v_s = k_s + BN * LD;                                                     // (BN, LD) its values
    __syncthreads();
    if (k0 > wrow + 15 || k0 + BN <= wlo) continue;  // after every query of the warp, or before their documents
    float s[NT][4], dp[NT][4];  // (16 x BN) scores and dP = dO V^T
    scores<LD, KS>(q_s, 16 * warp, k_s, s);
    scores<LD, KS>(do_s, 16 * warp, v_s, dp);
    const bool edge = ds || k0 + BN - 1 > wrow || k0 + BN > T;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = k0 + 8 * nt + 2 * c4 + (j & 1);
        const bool masked = edge && (key > rows[j / 2] || key >= T || key < lo[j / 2]);
        const float p = masked ? 0.0f : exp2f(s[nt][j] * scale2 - lse2[j / 2]);
        s[nt][j] = p * (dp[nt][j] - drow[j / 2]);  // dS
      }
    accumulate<LD, BN / 16>(s, k_s, acc);  // dQ += dS K
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = rows[r];
    if (t >= T) continue;
    bf16* dst = dq + (int64_t(b) * T + t) * ldq + int64_t(h) * HD + 2 * c4;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(dst + 8 * dt) = pack_bf16(acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
  }
}

// grid (B*KV, ceil(T / 64)), block 128, dynamic shared memory (2 x 64 + 2 x 2 x BQ) x (HD + 8) bf16 + 2 x 3 x BQ
// floats.
template <int HD, int BQ>
__global__ void __launch_bounds__(kThreads)
    mma_dkv_kernel(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv,
                   const float* lse, const float* row_dot, bf16* dk, bf16* dv, int T, int H, int KV,
                   const int32_t* doc_start) {
  constexpr int LD = HD + 8, NQ = BQ / 8, KS = HD / 16, DT = HD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);  // (64, LD) this block's keys
  bf16* v_s = k_s + kRows * LD;               // (64, LD) their values
  bf16* qdo_s = v_s + kRows * LD;             // two stages of [(BQ, LD) a query tile, (BQ, LD) its output gradients]
  // two stages of [(BQ) lse in log2 units, (BQ) D, (BQ) each query's document start (int)]
  float* f_s = reinterpret_cast<float*>(qdo_s + 2 * 2 * BQ * LD);
  const int bkv = blockIdx.x, b = bkv / KV, kvh = bkv % KV, group = H / KV, C = H * HD;
  const int s0 = blockIdx.y * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, c4 = lane % 4;
  const int wkey = s0 + 16 * warp;  // the warp's first key
  const int keys[2] = {wkey + lane / 4, wkey + lane / 4 + 8};
  const bf16* kseq = k + int64_t(b) * T * ldkv + int64_t(kvh) * HD;
  const bf16* vseq = v + int64_t(b) * T * ldkv + int64_t(kvh) * HD;
  const float scale = 1.0f / sqrtf(float(HD)), scale2 = kLog2e / sqrtf(float(HD));
  // Document mask: the queries that see the block's keys end where the document of its last key ends (the first
  // query whose document starts after that key; documents are contiguous, so a lower bound).
  const int32_t* ds = doc_start ? doc_start + int64_t(b) * T : nullptr;  // (T)
  int q_stop = T;
  if (ds) {
    const int s_last = min(T, s0 + kRows) - 1;
    int lo = s_last + 1, hi = T;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (ds[mid] <= s_last) lo = mid + 1;
      else hi = mid;
    }
    q_stop = lo;
  }
  // The (query head, query tile) pairs that see the block's keys, heads in order, tiles from s0 (queries before s0
  // see none of them): tile i's copies go to stage i % 2 while tile i - 1 is used.
  const int n_q = (q_stop - s0 + BQ - 1) / BQ, tiles = group * n_q;
  auto issue = [&](int i, int st) {
    const int h = kvh * group + i / n_q, q0 = s0 + (i % n_q) * BQ;
    bf16* qs = qdo_s + st * 2 * BQ * LD;
    load_tile_async<HD, BQ>(q + int64_t(b) * T * ldq + int64_t(h) * HD, ldq, q0, T, qs);
    load_tile_async<HD, BQ>(dout + int64_t(b) * T * C + int64_t(h) * HD, C, q0, T, qs + BQ * LD);
    cp_async_commit();
    if (threadIdx.x < BQ) {  // plain stores: read after the __syncthreads that precedes the tile's use
      float* f = f_s + st * 3 * BQ;
      const int t = q0 + threadIdx.x;
      const int64_t at = int64_t(b * H + h) * T + t;
      f[threadIdx.x] = t < T ? lse[at] * kLog2e : 0.0f;
      f[BQ + threadIdx.x] = t < T ? row_dot[at] : 0.0f;
      reinterpret_cast<int*>(f + 2 * BQ)[threadIdx.x] = t < T && ds ? ds[t] : 0;
    }
  };

  load_tile_async<HD, kRows>(kseq, ldkv, s0, T, k_s);  // in the first tile's group
  load_tile_async<HD, kRows>(vseq, ldkv, s0, T, v_s);
  issue(0, 0);
  float dkacc[DT][4], dvacc[DT][4];  // (16 x HD) each: dK (before the scale) and dV of the warp's keys
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int j = 0; j < 4; ++j) dkacc[dt][j] = dvacc[dt][j] = 0.0f;
  for (int tile = 0, stage = 0; tile < tiles; ++tile, stage ^= 1) {
    __syncthreads();  // every warp is done with the previous tile, whose stage the next one overwrites
    if (tile + 1 < tiles) {
      issue(tile + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q0 = s0 + (tile % n_q) * BQ;
    const bf16* q_s = qdo_s + stage * 2 * BQ * LD;  // (BQ, LD) the current query tile
    const bf16* do_s = q_s + BQ * LD;                // (BQ, LD) its output gradients
    const float* lse2_s = f_s + stage * 3 * BQ;      // (BQ) lse in log2 units
    const float* drow_s = lse2_s + BQ;               // (BQ) D
    const int* lo_s = reinterpret_cast<const int*>(drow_s + BQ);  // (BQ) each query's document start
    if (q0 + BQ - 1 < wkey) continue;  // every query of the tile is before every key of the warp
    float st[NQ][4], dpt[NQ][4];       // (16 keys x BQ queries): S^T and dP^T = V dO^T
    scores<LD, KS>(k_s, 16 * warp, q_s, st);
    scores<LD, KS>(v_s, 16 * warp, do_s, dpt);
    const bool edge = ds || q0 < wkey + 15 || q0 + BQ > T;
#pragma unroll
    for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * nt + 2 * c4 + (j & 1), t = q0 + i;  // the query of this element
        const bool masked = edge && (t < keys[j / 2] || t >= T || lo_s[i] > keys[j / 2]);
        const float p = masked ? 0.0f : exp2f(st[nt][j] * scale2 - lse2_s[i]);
        st[nt][j] = p;                            // P^T
        dpt[nt][j] = p * (dpt[nt][j] - drow_s[i]);  // dS^T
      }
    accumulate<LD, BQ / 16>(st, do_s, dvacc);   // dV += P^T dO
    accumulate<LD, BQ / 16>(dpt, q_s, dkacc);   // dK += dS^T Q
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int s = keys[r];
    if (s >= T) continue;
    const int64_t at = (int64_t(b) * T + s) * ldkv + int64_t(kvh) * HD + 2 * c4;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dk + at + 8 * dt) =
          pack_bf16(dkacc[dt][2 * r] * scale, dkacc[dt][2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + at + 8 * dt) = pack_bf16(dvacc[dt][2 * r], dvacc[dt][2 * r + 1]);
    }
  }
}

// launchers -------------------------------------------------------------------------------------

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int HD>
void forward(const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv, bf16* out, float* lse, int64_t B,
             int64_t T, int64_t H, int64_t KV, const int32_t* doc_start, cudaStream_t stream) {
  // The queries, two stages of keys and values.
  const size_t smem = size_t(kRows + 2 * 2 * kForwardKeys) * (HD + 8) * sizeof(bf16);
  allow_shared(mma_forward_kernel<HD>, smem);
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>((T + kRows - 1) / kRows));
  mma_forward_kernel<HD><<<grid, kThreads, smem, stream>>>(q, k, v, ldq, ldkv, out, lse, int(T), int(H), int(KV),
                                                           doc_start);
  CUDA_CHECK(cudaGetLastError());
}

// Key tiles of the dQ kernel and query tiles of the dK/dV kernel: 64 at HD 64, 32 at HD 128 (registers).
template <int HD>
void backward(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv,
              const float* lse, const float* row_dot, bf16* dq, bf16* dk, bf16* dv, int64_t B, int64_t T, int64_t H,
              int64_t KV, const int32_t* doc_start, cudaStream_t stream) {
  constexpr int BN = HD <= 64 ? 64 : 32;
  const size_t smem_q = size_t(2 * kRows + 2 * 2 * BN) * (HD + 8) * sizeof(bf16);
  allow_shared(mma_dq_kernel<HD, BN>, smem_q);
  const dim3 grid_q(static_cast<unsigned>(B * H), static_cast<unsigned>((T + kRows - 1) / kRows));
  mma_dq_kernel<HD, BN><<<grid_q, kThreads, smem_q, stream>>>(dout, q, k, v, ldq, ldkv, lse, row_dot, dq, int(T),
                                                               int(H), int(KV), doc_start);
  CUDA_CHECK(cudaGetLastError());
  const size_t smem_kv = size_t(2 * kRows + 2 * 2 * BN) * (HD + 8) * sizeof(bf16) + 2 * 3 * BN * sizeof(float);
  allow_shared(mma_dkv_kernel<HD, BN>, smem_kv);
  const dim3 grid_kv(static_cast<unsigned>(B * KV), static_cast<unsigned>((T + kRows - 1) / kRows));
  mma_dkv_kernel<HD, BN><<<grid_kv, kThreads, smem_kv, stream>>>(dout, q, k, v, ldq, ldkv, lse, row_dot, dk, dv,
                                                                  int(T), int(H), int(KV), doc_start);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool flash_mma_supported(int64_t hd, int64_t ldq, int64_t ldkv, const void* const* ptrs, int n_ptrs) {
  if (hd != 64 && hd != 128) return false;
  if (ldq % 8 != 0 || ldkv % 8 != 0) return false;  // 16-byte rows of bf16
  for (int i = 0; i < n_ptrs; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
  return true;
}

void flash_mma_forward(const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv, bf16* out, float* lse,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start,
                       cudaStream_t stream) {
  RELAY_ASSERT(B * H <= INT_MAX && T <= INT_MAX && (T + kRows - 1) / kRows <= 65535,
               "flash_mma_forward: B " << B << ", T " << T << ", H " << H << " exceed the launch limits");
  if (hd == 64) return forward<64>(q, k, v, ldq, ldkv, out, lse, B, T, H, KV, doc_start, stream);
  RELAY_ASSERT(hd == 128, "flash_mma_forward: head dim " << hd);
  forward<128>(q, k, v, ldq, ldkv, out, lse, B, T, H, KV, doc_start, stream);
}

void flash_mma_backward(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, int64_t ldq, int64_t ldkv,
                        const float* lse, const float* row_dot, bf16* dq, bf16* dk, bf16* dv, int64_t B, int64_t T,
                        int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start, cudaStream_t stream) {
  RELAY_ASSERT(B * H <= INT_MAX && T <= INT_MAX && (T + kRows - 1) / kRows <= 65535,
               "flash_mma_backward: B " << B << ", T " << T << ", H " << H << " exceed the launch limits");
  if (hd == 64) return backward<64>(dout, q, k, v, ldq, ldkv, lse, row_dot, dq, dk, dv, B, T, H, KV, doc_start, stream);
  RELAY_ASSERT(hd == 128, "flash_mma_backward: head dim " << hd);
  backward<128>(dout, q, k, v, ldq, ldkv, lse, row_dot, dq, dk, dv, B, T, H, KV, doc_start, stream);
}

}  // namespace relay::cuda
