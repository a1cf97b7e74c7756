// FlashAttention-2 causal attention kernels (Dao arXiv:2307.08691, Algorithms 1 and 2), float or bf16
// storage with float math; correctness and determinism first, the tiles are small and simple. bf16 calls
// with head size 64 or 128 and aligned rows go to the tensor-core kernels of flash_attention_mma.cu instead.
//   forward: one block per (b, h, tile of kFwdRows queries). Warp w owns the tile's rows w, w + 4, ...;
//     for each tile of 32 keys, lane j scores key j, the warp updates the row's running max and sum
//     (the online softmax), and lane d accumulates output dims d, d + 32, ... (Algorithm 1).
//   backward: D = rowsum(dO * O) for every row first (one warp per row); then dQ per query tile (one
//     block per (b, h, tile of kDqRows queries), walking key tiles) and dK, dV per key tile (one block
//     per (b, h, tile of kDkvRows keys), walking query tiles). Algorithm 2 is split in two kernels so
//     that every output element has one owner: no atomics, and the same bits on every run. Both
//     recompute P = exp(scale q.k - lse) from the forward's lse with the same arithmetic.
// The tile of the other side (keys, or queries for dK/dV) sits in shared memory transposed, (hd, 32 + 1):
// lane j reads column j when scoring, lane d reads row d when accumulating, both free of bank conflicts.
// Nothing of size T x T exists; scores stay in registers, one per lane.
// q, k, v are strided row views (q rows ldq apart, k and v rows ldkv apart), so that GPT's packed qkv
// (q = qkv, k = qkv + C, v = qkv + 2C, ld 3C) and Llama's separate grouped-query q, k, v share the kernels:
// query head h reads key/value head h / (H / KV). The dK/dV blocks of a key/value head walk its query heads
// in order (KV == H: one head, the packed op's arithmetic unchanged).
// Positioned queries (context parallelism, flash_attention_gqa_forward_at): q holds Tq rows of each sequence, k and
// v its Tk gathered rows, and query t sits at key position q_pos[t] (non-decreasing) instead of t. Without q_pos
// the kernels are the self-attention ones above, with the same arithmetic: every loop bound below reduces to its
// old value when q_pos is null and Tq == Tk.
// Value heads may be narrower or wider than query/key heads (DeepSeek-V3's MLA: hd 192, hd_v 128; the CPU's
// flash_attention_gqa_* take the same): hd is q's and k's head width, hd_v v's, out's and dout's; the scale stays
// 1 / sqrt(hd). Each kernel holds a query/key tile of D = 32 DPL dims and a value tile of DV = 32 VPL dims (register
// tiles of DPL and VPL dims per lane); hd_v == hd is the case DPL == VPL, whose arithmetic is the one-width kernels'.
// The D-wide tiles sit in dynamic shared memory (above 48 KiB at D = 192, opted into per launch).
#include "kernels/cuda/flash_attention.cuh"

#include <algorithm>
#include <climits>

#include <type_traits>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_utils.cuh"
#include "kernels/cuda/flash_attention_mma.cuh"

namespace relay::cuda {

// kernels ---------------------------------------------------------------------------------------

constexpr int kWarps = 4;              // warps per block
constexpr int kThreads = 32 * kWarps;  // threads per block
constexpr int kTile = 32;              // keys (forward, dQ) or queries (dK, dV) per shared tile: one per lane
constexpr int kFwdRows = 16;           // queries per forward block, 4 per warp
constexpr int kDqRows = 8;             // queries per dQ block, 2 per warp
constexpr int kDkvRows = 8;            // keys per dK/dV block, 2 per warp
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
// Shared memory at hd = hd_v = 128 (D = DV = 128): forward 8 KiB of queries + 2 x 16.5 KiB of key/value tiles; dQ
// and dK/dV the same (two 4 KiB row tiles instead of one 8 KiB): 41 KiB. At hd = 192 (D = DV = 192, or DV = 128)
// up to 61.5 KiB: above the 48 KiB a launch gets by default, so the launchers raise the kernel's limit first.

// dst (rows, D) = rows [t0, t0 + rows) of src (T, ld), dims [0, hd), as float; 0 beyond T and hd.
template <typename X, int D>
__device__ void load_rows(const X* src, int64_t ld, int t0, int rows, int T, int hd, float (*dst)[D]) {
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    dst[r][d] = t < T && d < hd ? load(src[int64_t(t) * ld + d]) : 0.0f;
  }
}

// dst (D, kTile + 1) = rows [t0, t0 + kTile) of src (T, ld), dims [0, hd), transposed: dst[d][r].
// Consecutive threads take consecutive d of one row: coalesced reads, conflict-free writes (stride 33).
template <typename X, int D>
__device__ void load_tile_transposed(const X* src, int64_t ld, int t0, int T, int hd, float (*dst)[kTile + 1]) {
  for (int i = threadIdx.x; i < kTile * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    dst[d][r] = t < T && d < hd ? load(src[int64_t(t) * ld + d]) : 0.0f;
  }
}

// a (hd) . column col of bt (D, kTile + 1), summed over d in order.
template <int D>
__device__ inline float dot_column(const float* a, const float (*bt)[kTile + 1], int col, int hd) {
  float s = 0.0f;
  for (int d = 0; d < hd; ++d) s += a[d] * bt[d][col];
  return s;
}

// The key position of query row t: qp[t] (qp, (Tq) non-decreasing), or t itself for self-attention (qp null).
__device__ inline int position_of(const int32_t* qp, int t) { return qp ? qp[t] : t; }

// The first query row in [lo, hi) whose value in a (non-decreasing) is at least x; hi if none. Every thread of a
// block computes the same answer.
__device__ inline int lower_bound(const int32_t* a, int lo, int hi, int x) {
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Dynamic shared memory of each kernel (bytes) for query/key tiles of D dims and value tiles of DV dims.
// The forward: its queries (kFwdRows, D), a key tile (D, kTile + 1) and a value tile (DV, kTile + 1).
constexpr size_t forward_smem_bytes(int D, int DV) {
  return sizeof(float) * (size_t(kFwdRows) * D + size_t(D + DV) * (kTile + 1));
}
// dQ: its queries (kDqRows, D) and their output gradients (kDqRows, DV), a key tile (D, .) and a value tile (DV, .).
constexpr size_t dq_smem_bytes(int D, int DV) {
  return sizeof(float) * (size_t(kDqRows) * (D + DV) + size_t(D + DV) * (kTile + 1));
}
// dK/dV: its keys (kDkvRows, D) and values (kDkvRows, DV), a query tile (D, .) and its output gradients (DV, .).
constexpr size_t dkv_smem_bytes(int D, int DV) {
  return sizeof(float) * (size_t(kDkvRows) * (D + DV) + size_t(D + DV) * (kTile + 1));
}

// grid (B*H, ceil(Tq / kFwdRows)), block (kThreads), dynamic shared memory forward_smem_bytes(D, DV).
// DPL, VPL = query/key and value dims per lane, D = 32 DPL >= hd, DV = 32 VPL >= hd_v.
// q_pos (B*Tq) or null (then Tq == Tk and query t sits at position t); doc_start (B*Tq) or null.
template <typename X, int DPL, int VPL>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const X* q_in, const X* k_in, const X* v_in, int64_t ldq, int64_t ldk, int64_t ldv, X* out,
                         float* lse, int Tq, int Tk, const int32_t* q_pos, int H, int KV, int hd, int hd_v,
                         const int32_t* doc_start) {
  constexpr int D = 32 * DPL, DV = 32 * VPL;
  constexpr int R = kFwdRows / kWarps;  // query rows per warp
  extern __shared__ float smem[];
  float(*q_s)[D] = reinterpret_cast<float(*)[D]>(smem);                                  // (kFwdRows, D) queries
  float(*k_t)[kTile + 1] = reinterpret_cast<float(*)[kTile + 1]>(smem + kFwdRows * D);  // (D, keys) key tile
  float(*v_t)[kTile + 1] = k_t + D;                                                      // (DV, keys) its values
  const int Cv = H * hd_v, bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int q0 = blockIdx.y * kFwdRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const X* qseq = q_in + int64_t(b) * Tq * ldq + int64_t(h) * hd;       // (Tq, ldq): this sequence, this head
  const X* kseq = k_in + int64_t(b) * Tk * ldk + int64_t(kvh) * hd;     // (Tk, ldk): its key head
  const X* vseq = v_in + int64_t(b) * Tk * ldv + int64_t(kvh) * hd_v;   // (Tk, ldv): its value head
  const int32_t* qp = q_pos ? q_pos + int64_t(b) * Tq : nullptr;         // (Tq) key positions of the queries, or null
  const float scale2 = kLog2e / sqrtf(float(hd));  // scores in log2 units: the softmax uses exp2

  load_rows<X, D>(qseq, ldq, q0, kFwdRows, Tq, hd, q_s);
  float m[R], l[R], acc[R][VPL];  // per row: running max (log2 units), running sum, output dims of this lane
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) acc[rr][i] = 0.0f;
  }
  // Keys after the block's last query's position are never seen (positions are non-decreasing).
  const int k_end = position_of(qp, min(Tq, q0 + kFwdRows) - 1) + 1;
  const int32_t* ds = doc_start ? doc_start + int64_t(b) * Tq : nullptr;  // (Tq) each query's document start
  // Key tiles before the block's first document start (documents are contiguous: the first row's) are skipped.
  for (int k0 = ds && q0 < Tq ? ds[q0] / kTile * kTile : 0; k0 < k_end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous tile
    load_tile_transposed<X, D>(kseq, ldk, k0, Tk, hd, k_t);
    load_tile_transposed<X, DV>(vseq, ldv, k0, Tk, hd_v, v_t);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int t = q0 + warp + rr * kWarps;
      if (t >= Tq) continue;             // the same for the whole warp
      const int pt = position_of(qp, t);  // the row's key position: it sees keys [lo, pt]
      if (pt < k0) continue;              // warp-uniform: this row sees no key of the tile
      const int lo = ds ? ds[t] : 0;      // the row's first visible key
      if (k0 + kTile <= lo) continue;     // its document starts after the tile
      const int visible = min(kTile, pt - k0 + 1);  // keys k0 .. k0 + visible - 1
      const bool seen = lane < visible && k0 + lane >= lo;
      const float score = seen ? dot_column<D>(q_s[t - q0], k_t, lane, hd) * scale2 : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(score));  // finite: the tile holds a key in [lo, pt]
      const float p = exp2f(score - m_new);               // 0 for a masked key
      const float corr = exp2f(m[rr] - m_new);            // 0 on the row's first tile (m = -inf)
      l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
      for (int i = 0; i < VPL; ++i) acc[rr][i] *= corr;
      for (int j = max(0, lo - k0); j < visible; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int i = 0; i < VPL; ++i) acc[rr][i] += pj * v_t[lane + 32 * i][j];
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int t = q0 + warp + rr * kWarps;
    if (t >= Tq) continue;
    const float inv = 1.0f / l[rr];
    X* o = out + (int64_t(b) * Tq + t) * Cv + int64_t(h) * hd_v;  // (hd_v)
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd_v) store(o[d], acc[rr][i] * inv);
    }
    if (lane == 0) lse[int64_t(bh) * Tq + t] = (m[rr] + log2f(l[rr])) * kLn2;
  }
}

// grid (ceil(B*H*T / kWarps)), block (kThreads): one warp per row (b, h, t) in lse's order:
// row_dot[row] = dout . out over the head's hd columns (FlashAttention-2's D); C = H hd (hd the value head's).
template <typename X>
__global__ void flash_backward_row_dot_kernel(const X* dout, const X* out, float* row_dot, int64_t rows, int T, int C,
                                              int H) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = threadIdx.x % 32, hd = C / H, t = int(row % T);
  const int64_t bh = row / T, b = bh / H, h = bh % H;
  const int64_t at = (b * T + t) * C + h * hd;  // (hd) of this row in (B*T, C)
  float s = 0.0f;
  for (int d = lane; d < hd; d += 32) s += load(dout[at + d]) * load(out[at + d]);
  s = warp_sum(s);
  if (lane == 0) row_dot[row] = s;
}

// grid (B*H, ceil(Tq / kDqRows)), block (kThreads), dynamic shared memory dq_smem_bytes(D, DV): dQ of kDqRows
// queries, over their key tiles.
//   P = exp2(scale2 q.k - lse2), dP = dO.v, dS = P (dP - D), dQ = scale sum_s dS k_s.
template <typename X, int DPL, int VPL>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(const X* dout, const X* q_in, const X* k_in, const X* v_in, int64_t ldq, int64_t ldk,
                             int64_t ldv, const float* lse, const float* row_dot, X* dq_out, int Tq, int Tk,
                             const int32_t* q_pos, int H, int KV, int hd, int hd_v, const int32_t* doc_start) {
  constexpr int D = 32 * DPL, DV = 32 * VPL;
  constexpr int R = kDqRows / kWarps;  // query rows per warp
  extern __shared__ float smem[];
  float(*q_s)[D] = reinterpret_cast<float(*)[D]>(smem);                                 // (kDqRows, D) queries
  float(*do_s)[DV] = reinterpret_cast<float(*)[DV]>(smem + kDqRows * D);                // (kDqRows, DV) their dO
  float(*k_t)[kTile + 1] = reinterpret_cast<float(*)[kTile + 1]>(smem + kDqRows * (D + DV));  // (D, keys)
  float(*v_t)[kTile + 1] = k_t + D;                                                     // (DV, keys) its values
  const int Cv = H * hd_v, bh = blockIdx.x, b = bh / H, h = bh % H, kvh = h / (H / KV);
  const int q0 = blockIdx.y * kDqRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const X* qseq = q_in + int64_t(b) * Tq * ldq + int64_t(h) * hd;      // (Tq, ldq)
  const X* kseq = k_in + int64_t(b) * Tk * ldk + int64_t(kvh) * hd;    // (Tk, ldk)
  const X* vseq = v_in + int64_t(b) * Tk * ldv + int64_t(kvh) * hd_v;  // (Tk, ldv)
  const X* dseq = dout + int64_t(b) * Tq * Cv + int64_t(h) * hd_v;     // (Tq, Cv)
  const int32_t* qp = q_pos ? q_pos + int64_t(b) * Tq : nullptr;        // (Tq) key positions of the queries, or null
  const float scale = 1.0f / sqrtf(float(hd)), scale2 = kLog2e / sqrtf(float(hd));

  load_rows<X, D>(qseq, ldq, q0, kDqRows, Tq, hd, q_s);
  load_rows<X, DV>(dseq, Cv, q0, kDqRows, Tq, hd_v, do_s);
  float dq[R][DPL], lse2[R], drow[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int t = q0 + warp + rr * kWarps;
    lse2[rr] = t < Tq ? lse[int64_t(bh) * Tq + t] * kLog2e : 0.0f;
    drow[rr] = t < Tq ? row_dot[int64_t(bh) * Tq + t] : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) dq[rr][i] = 0.0f;
  }
  const int k_end = position_of(qp, min(Tq, q0 + kDqRows) - 1) + 1;  // past the block's last query's position
  const int32_t* dst = doc_start ? doc_start + int64_t(b) * Tq : nullptr;  // (Tq) each query's document start
  for (int k0 = dst && q0 < Tq ? dst[q0] / kTile * kTile : 0; k0 < k_end; k0 += kTile) {
    __syncthreads();
    load_tile_transposed<X, D>(kseq, ldk, k0, Tk, hd, k_t);
    load_tile_transposed<X, DV>(vseq, ldv, k0, Tk, hd_v, v_t);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const int t = q0 + warp + rr * kWarps;
      if (t >= Tq) continue;  // warp-uniform
      const int pt = position_of(qp, t);
      if (pt < k0) continue;  // warp-uniform: the row sees no key of the tile
      const int lo = dst ? dst[t] : 0;
      if (k0 + kTile <= lo) continue;  // warp-uniform: the row's document starts after the tile
      const int visible = min(kTile, pt - k0 + 1);
      float ds = 0.0f;  // dS of query t and key k0 + lane
      if (lane < visible && k0 + lane >= lo) {
        const float p = exp2f(dot_column<D>(q_s[t - q0], k_t, lane, hd) * scale2 - lse2[rr]);
        const float dp = dot_column<DV>(do_s[t - q0], v_t, lane, hd_v);
        ds = p * (dp - drow[rr]);
      }
      for (int j = max(0, lo - k0); j < visible; ++j) {
        const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int i = 0; i < DPL; ++i) dq[rr][i] += dsj * k_t[lane + 32 * i][j];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int t = q0 + warp + rr * kWarps;
    if (t >= Tq) continue;
    X* g = dq_out + (int64_t(b) * Tq + t) * ldq + int64_t(h) * hd;  // (hd) of row t
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) store(g[d], dq[rr][i] * scale);
    }
  }
}

// grid (B*KV, ceil(Tk / kDkvRows)), block (kThreads), dynamic shared memory dkv_smem_bytes(D, DV): dK and dV of
// kDkvRows keys of one key/value head, over its query heads in order and for each the query tiles that see them.
// dV = sum_t P dO_t, dK = scale sum_t dS q_t. A key no query sees (after every query's position) gets dK = dV = 0.
template <typename X, int DPL, int VPL>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkv_kernel(const X* dout, const X* q_in, const X* k_in, const X* v_in, int64_t ldq, int64_t ldk,
                              int64_t ldv, const float* lse, const float* row_dot, X* dk_out, X* dv_out, int Tq,
                              int Tk, const int32_t* q_pos, int H, int KV, int hd, int hd_v,
                              const int32_t* doc_start) {
  constexpr int D = 32 * DPL, DV = 32 * VPL;
  constexpr int R = kDkvRows / kWarps;  // key rows per warp
  extern __shared__ float smem[];
  float(*k_s)[D] = reinterpret_cast<float(*)[D]>(smem);                   // (kDkvRows, D) this block's keys
  float(*v_s)[DV] = reinterpret_cast<float(*)[DV]>(smem + kDkvRows * D);  // (kDkvRows, DV) their values
  float(*q_t)[kTile + 1] = reinterpret_cast<float(*)[kTile + 1]>(smem + kDkvRows * (D + DV));  // (D, queries)
  float(*do_t)[kTile + 1] = q_t + D;                                      // (DV, queries) their output gradients
  __shared__ float lse2_s[kTile];  // (queries) lse in log2 units
  __shared__ float drow_s[kTile];  // (queries) D
  __shared__ int lo_s[kTile];      // (queries) document starts
  __shared__ int pos_s[kTile];     // (queries) key positions
  const int Cv = H * hd_v, bkv = blockIdx.x, b = bkv / KV, kvh = bkv % KV, group = H / KV;
  const int s0 = blockIdx.y * kDkvRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const X* kseq = k_in + int64_t(b) * Tk * ldk + int64_t(kvh) * hd;    // (Tk, ldk)
  const X* vseq = v_in + int64_t(b) * Tk * ldv + int64_t(kvh) * hd_v;  // (Tk, ldv)
  const float scale = 1.0f / sqrtf(float(hd)), scale2 = kLog2e / sqrtf(float(hd));
  const int32_t* qp = q_pos ? q_pos + int64_t(b) * Tq : nullptr;           // (Tq) key positions of the queries
  const int32_t* dst = doc_start ? doc_start + int64_t(b) * Tq : nullptr;  // (Tq) each query's document start
  // Queries at positions before s0 see none of the block's keys: the first that may is the first at position s0 or
  // later (s0 itself without q_pos).
  const int q_first = qp ? lower_bound(qp, 0, Tq, s0) : min(s0, Tq);
  // Queries whose document starts after the block's last key see none of its keys: with a document mask the
  // query range ends where that key's document ends (the first query whose document starts after it).
  const int s_last = min(Tk, s0 + kDkvRows) - 1;
  const int q_stop = dst ? lower_bound(dst, q_first, Tq, s_last + 1) : Tq;

  load_rows<X, D>(kseq, ldk, s0, kDkvRows, Tk, hd, k_s);
  load_rows<X, DV>(vseq, ldv, s0, kDkvRows, Tk, hd_v, v_s);
  float dk[R][DPL], dv[R][VPL];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) dk[rr][i] = 0.0f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) dv[rr][i] = 0.0f;
  }
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {  // the query heads sharing these keys, in order
    const int bh = b * H + h;
    const X* qseq = q_in + int64_t(b) * Tq * ldq + int64_t(h) * hd;   // (Tq, ldq)
    const X* dseq = dout + int64_t(b) * Tq * Cv + int64_t(h) * hd_v;  // (Tq, Cv)
    // From the tile that holds the first query that may see these keys.
    for (int q0 = q_first / kTile * kTile; q0 < q_stop; q0 += kTile) {
      __syncthreads();
      load_tile_transposed<X, D>(qseq, ldq, q0, Tq, hd, q_t);
      load_tile_transposed<X, DV>(dseq, Cv, q0, Tq, hd_v, do_t);
      if (threadIdx.x < kTile) {
        const int t = q0 + threadIdx.x;
        lse2_s[threadIdx.x] = t < Tq ? lse[int64_t(bh) * Tq + t] * kLog2e : 0.0f;
        drow_s[threadIdx.x] = t < Tq ? row_dot[int64_t(bh) * Tq + t] : 0.0f;
        lo_s[threadIdx.x] = t < Tq && dst ? dst[t] : 0;
        pos_s[threadIdx.x] = t < Tq ? position_of(qp, t) : INT_MAX;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const int s = s0 + warp + rr * kWarps;
        // Queries q0 + [first, last) see key s by position: positions are non-decreasing, so those before it are
        // a prefix of the tile (first = max(0, s - q0) without q_pos). The same for the whole warp.
        const int last = min(kTile, Tq - q0);
        const int first = __popc(__ballot_sync(0xffffffffu, lane < last && pos_s[lane] < s));
        if (s >= Tk || first >= last) continue;
        float p = 0.0f, ds = 0.0f;  // P and dS of query q0 + lane and key s
        if (lane >= first && lane < last && lo_s[lane] <= s) {  // query q0 + lane sees key s
          p = exp2f(dot_column<D>(k_s[s - s0], q_t, lane, hd) * scale2 - lse2_s[lane]);
          const float dp = dot_column<DV>(v_s[s - s0], do_t, lane, hd_v);
          ds = p * (dp - drow_s[lane]);
        }
        for (int j = first; j < last; ++j) {
          const float pj = __shfl_sync(0xffffffffu, p, j), dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
          for (int i = 0; i < VPL; ++i) dv[rr][i] += pj * do_t[lane + 32 * i][j];
#pragma unroll
          for (int i = 0; i < DPL; ++i) dk[rr][i] += dsj * q_t[lane + 32 * i][j];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const int s = s0 + warp + rr * kWarps;
    if (s >= Tk) continue;
    X* gk = dk_out + (int64_t(b) * Tk + s) * ldk + int64_t(kvh) * hd;    // (hd) of row s
    X* gv = dv_out + (int64_t(b) * Tk + s) * ldv + int64_t(kvh) * hd_v;  // (hd_v) of row s
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) store(gk[d], dk[rr][i] * scale);
    }
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd_v) store(gv[d], dv[rr][i]);
    }
  }
}

// launchers -------------------------------------------------------------------------------------

namespace {

// The shapes every launcher needs: hd and hd_v in [1, kFlashMaxHeadDim], KV dividing H, the grid within CUDA's limits
// (blocks of (b, h) on x, tiles of Tq or Tk on y, at most 65535), and int-sized T and H*hd. T is the longer of Tq
// and Tk (the same for self-attention).
void check_shape(const char* op, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t hd_v) {
  RELAY_ASSERT(B >= 0 && T >= 0 && H > 0 && KV > 0 && H % KV == 0 && hd > 0 && hd_v > 0,
               op << ": B " << B << ", T " << T << ", H " << H << ", KV " << KV << ", head dims " << hd << ", "
                  << hd_v);
  RELAY_ASSERT(hd <= kFlashMaxHeadDim && hd_v <= kFlashMaxHeadDim,
               op << ": head dims " << hd << " (query/key) and " << hd_v << " (value): above " << kFlashMaxHeadDim);
  RELAY_ASSERT(B * H <= INT_MAX && T <= INT_MAX && 3 * H * std::max(hd, hd_v) <= INT_MAX &&
                   (T + kDqRows - 1) / kDqRows <= 65535,
               op << ": B " << B << ", T " << T << ", H " << H << ", head dim " << hd << " exceed the launch limits");
}

// Head dims per lane: 1 for hd <= 32, ..., 6 for hd <= 192.
int dims_per_lane(int64_t hd) { return static_cast<int>((hd + 31) / 32); }

// The strided views of one call: Tq query rows and Tk key rows of each sequence.
template <typename X>
struct Views {
  const X *q, *k, *v;
  int64_t ldq, ldk, ldv, B, Tq, Tk, H, KV, hd, hd_v;
  const int32_t* q_pos;      // (B*Tq) key positions of the queries, or null (Tq == Tk, query t at t)
  const int32_t* doc_start;  // (B*Tq) or null
};

// Lets kernel use `bytes` of dynamic shared memory: above the 48 KiB every launch may use, the kernel must opt in
// (cudaFuncAttributeMaxDynamicSharedMemorySize; sm_70 and later allow more, sm_90 227 KiB).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename X, int DPL, int VPL>
void launch_forward(const Views<X>& a, X* out, float* lse, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((a.Tq + kFwdRows - 1) / kFwdRows));
  const size_t smem = forward_smem_bytes(32 * DPL, 32 * VPL);
  allow_smem(flash_forward_kernel<X, DPL, VPL>, smem);
  flash_forward_kernel<X, DPL, VPL><<<grid, kThreads, smem, stream>>>(
      a.q, a.k, a.v, a.ldq, a.ldk, a.ldv, out, lse, int(a.Tq), int(a.Tk), a.q_pos, int(a.H), int(a.KV), int(a.hd),
      int(a.hd_v), a.doc_start);
}

template <typename X, int DPL, int VPL>
void launch_backward(const Views<X>& a, const X* dout, const float* lse, const float* row_dot, X* dq, X* dk, X* dv,
                     cudaStream_t stream) {
  const dim3 grid_q(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((a.Tq + kDqRows - 1) / kDqRows));
  const size_t smem_q = dq_smem_bytes(32 * DPL, 32 * VPL);
  allow_smem(flash_backward_dq_kernel<X, DPL, VPL>, smem_q);
  flash_backward_dq_kernel<X, DPL, VPL><<<grid_q, kThreads, smem_q, stream>>>(
      dout, a.q, a.k, a.v, a.ldq, a.ldk, a.ldv, lse, row_dot, dq, int(a.Tq), int(a.Tk), a.q_pos, int(a.H), int(a.KV),
      int(a.hd), int(a.hd_v), a.doc_start);
  CUDA_CHECK(cudaGetLastError());
  const dim3 grid_kv(static_cast<unsigned>(a.B * a.KV), static_cast<unsigned>((a.Tk + kDkvRows - 1) / kDkvRows));
  const size_t smem_kv = dkv_smem_bytes(32 * DPL, 32 * VPL);
  allow_smem(flash_backward_dkv_kernel<X, DPL, VPL>, smem_kv);
  flash_backward_dkv_kernel<X, DPL, VPL><<<grid_kv, kThreads, smem_kv, stream>>>(
      dout, a.q, a.k, a.v, a.ldq, a.ldk, a.ldv, lse, row_dot, dk, dv, int(a.Tq), int(a.Tk), a.q_pos, int(a.H),
      int(a.KV), int(a.hd), int(a.hd_v), a.doc_start);
}

// The compiled register tiles: (P, P) with P = the dims per lane of the wider head, so any hd, hd_v <= 192 has one
// (the narrower head's lanes beyond its width hold zeros); P 5 shares P 6's tile. (6, 4) is DeepSeek-V3's MLA at full
// size (hd 192 = 128 + 64, hd_v 128), whose value tile needs no more than 4 dims per lane.
template <typename X, typename Launch>
void by_tile(const Views<X>& a, Launch&& launch) {
  const int dpl = dims_per_lane(a.hd), vpl = dims_per_lane(a.hd_v), wide = std::max(dpl, vpl);
  if (dpl > 4 && vpl <= 4) return launch(std::integral_constant<int, 6>{}, std::integral_constant<int, 4>{});
  switch (wide) {
    case 1: return launch(std::integral_constant<int, 1>{}, std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
    case 3: return launch(std::integral_constant<int, 3>{}, std::integral_constant<int, 3>{});
    case 4: return launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 4>{});
    default: return launch(std::integral_constant<int, 6>{}, std::integral_constant<int, 6>{});
  }
}

// The scalar kernels on any views (the tensor-core path is the callers' choice).
template <typename X>
void scalar_forward(const Views<X>& a, X* out, float* lse, cudaStream_t stream) {
  by_tile(a, [&](auto dpl, auto vpl) { launch_forward<X, decltype(dpl)::value, decltype(vpl)::value>(a, out, lse, stream); });
  CUDA_CHECK(cudaGetLastError());
}

// dQ, then dK and dV; row_dot (B, H, Tq): D = rowsum(dout * out), made by row_dots first.
template <typename X>
void scalar_backward(const Views<X>& a, const X* dout, const float* lse, const float* row_dot, X* dq, X* dk, X* dv,
                     cudaStream_t stream) {
  by_tile(a, [&](auto dpl, auto vpl) {
    launch_backward<X, decltype(dpl)::value, decltype(vpl)::value>(a, dout, lse, row_dot, dq, dk, dv, stream);
  });
  CUDA_CHECK(cudaGetLastError());
}

// row_dot (B, H, Tq) = rowsum(dout * out), dout and out (B*Tq, H*hd_v).
template <typename X>
void row_dots(const X* dout, const X* out, float* row_dot, int64_t B, int64_t Tq, int64_t H, int64_t hd_v,
              cudaStream_t stream) {
  const int64_t rows = B * H * Tq;
  flash_backward_row_dot_kernel<X><<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(
      dout, out, row_dot, rows, int(Tq), int(H * hd_v), int(H));
  CUDA_CHECK(cudaGetLastError());
}

// The tensor-core kernels take one head width and one leading dimension for k and v.
bool mma_views(int64_t hd, int64_t hd_v, int64_t ldk, int64_t ldv) { return hd == hd_v && ldk == ldv; }

}  // namespace

template <typename X>
void flash_attention_gqa_forward(const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk, int64_t ldv, X* out,
                                 float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t hd_v,
                                 const int32_t* doc_start, cudaStream_t stream) {
  check_shape("flash_attention_forward", B, T, H, KV, hd, hd_v);
  if (B == 0 || T == 0) return;
  RELAY_ASSERT(q && k && v && out && lse, "flash_attention_forward: null pointer");
  if constexpr (std::is_same_v<X, __nv_bfloat16>) {  // the tensor cores where the shape allows
    const void* ptrs[] = {q, k, v, out};
    if (mma_views(hd, hd_v, ldk, ldv) && flash_mma_supported(hd, ldq, ldk, ptrs, 4))
      return flash_mma_forward(q, k, v, ldq, ldk, out, lse, B, T, H, KV, hd, doc_start, stream);
  }
  scalar_forward(Views<X>{q, k, v, ldq, ldk, ldv, B, T, T, H, KV, hd, hd_v, nullptr, doc_start}, out, lse, stream);
}

template <typename X>
void flash_attention_gqa_backward(const X* dout, const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk,
                                  int64_t ldv, const X* out, const float* lse, X* dq, X* dk, X* dv, float* scratch,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int64_t hd_v,
                                  const int32_t* doc_start, cudaStream_t stream) {
  check_shape("flash_attention_backward", B, T, H, KV, hd, hd_v);
  if (B == 0 || T == 0) return;
  RELAY_ASSERT(dout && q && k && v && out && lse && dq && dk && dv && scratch, "flash_attention_backward: null pointer");
  row_dots(dout, out, scratch, B, T, H, hd_v, stream);  // scratch (B, H, T): D of every row
  if constexpr (std::is_same_v<X, __nv_bfloat16>) {
    const void* ptrs[] = {dout, q, k, v, dq, dk, dv};
    if (mma_views(hd, hd_v, ldk, ldv) && flash_mma_supported(hd, ldq, ldk, ptrs, 7))
      return flash_mma_backward(dout, q, k, v, ldq, ldk, lse, scratch, dq, dk, dv, B, T, H, KV, hd, doc_start,
                                stream);
  }
  scalar_backward(Views<X>{q, k, v, ldq, ldk, ldv, B, T, T, H, KV, hd, hd_v, nullptr, doc_start}, dout, lse, scratch,
                  dq, dk, dv, stream);
}

// Context parallelism's positioned queries: always the scalar kernels (the tensor-core ones know only self-attention).
template <typename X>
void flash_attention_gqa_forward_at(const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk, int64_t ldv, X* out,
                                    float* lse, int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H,
                                    int64_t KV, int64_t hd, int64_t hd_v, const int32_t* doc_start,
                                    cudaStream_t stream) {
  check_shape("flash_attention_gqa_forward_at", B, std::max(Tq, Tk), H, KV, hd, hd_v);
  if (B == 0 || Tq == 0) return;
  RELAY_ASSERT(Tk >= Tq, "flash_attention_gqa_forward_at: Tq " << Tq << " query rows against Tk " << Tk
                                                               << " key rows (need Tk >= Tq)");
  RELAY_ASSERT(q && k && v && out && lse && q_pos, "flash_attention_gqa_forward_at: null pointer");
  scalar_forward(Views<X>{q, k, v, ldq, ldk, ldv, B, Tq, Tk, H, KV, hd, hd_v, q_pos, doc_start}, out, lse, stream);
}

template <typename X>
void flash_attention_gqa_backward_at(const X* dout, const X* q, const X* k, const X* v, int64_t ldq, int64_t ldk,
                                     int64_t ldv, const X* out, const float* lse, X* dq, X* dk, X* dv, float* scratch,
                                     int64_t B, int64_t Tq, int64_t Tk, const int32_t* q_pos, int64_t H, int64_t KV,
                                     int64_t hd, int64_t hd_v, const int32_t* doc_start, cudaStream_t stream) {
  check_shape("flash_attention_gqa_backward_at", B, std::max(Tq, Tk), H, KV, hd, hd_v);
  if (B == 0 || Tq == 0) return;
  RELAY_ASSERT(Tk >= Tq, "flash_attention_gqa_backward_at: Tq " << Tq << " query rows against Tk " << Tk
                                                                << " key rows (need Tk >= Tq)");
  RELAY_ASSERT(dout && q && k && v && out && lse && dq && dk && dv && scratch && q_pos,
               "flash_attention_gqa_backward_at: null pointer");
  row_dots(dout, out, scratch, B, Tq, H, hd_v, stream);  // scratch (B, H, Tq): D of every query row
  scalar_backward(Views<X>{q, k, v, ldq, ldk, ldv, B, Tq, Tk, H, KV, hd, hd_v, q_pos, doc_start}, dout, lse, scratch,
                  dq, dk, dv, stream);
}

// GPT's packed qkv (B*T, 3C): q, k, v at columns 0, C, 2C of rows 3C apart; KV == H, hd_v == hd.
template <typename X>
void flash_attention_forward(const X* qkv, X* out, float* lse, int64_t B, int64_t T, int64_t C, int64_t H,
                             const int32_t* doc_start, cudaStream_t stream) {
  RELAY_ASSERT(H > 0 && C > 0 && C % H == 0, "flash_attention_forward: C " << C << ", H " << H);
  flash_attention_gqa_forward(qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, 3 * C, out, lse, B, T, H, H, C / H, C / H,
                              doc_start, stream);
}

template <typename X>
void flash_attention_backward(const X* dout, const X* qkv, const X* out, const float* lse, X* dqkv, float* scratch,
                              int64_t B, int64_t T, int64_t C, int64_t H, const int32_t* doc_start,
                              cudaStream_t stream) {
  RELAY_ASSERT(H > 0 && C > 0 && C % H == 0, "flash_attention_backward: C " << C << ", H " << H);
  flash_attention_gqa_backward(dout, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, 3 * C, out, lse, dqkv, dqkv + C,
                               dqkv + 2 * C, scratch, B, T, H, H, C / H, C / H, doc_start, stream);
}

#define INST(X)                                                                                                     \
  template void flash_attention_forward<X>(const X*, X*, float*, int64_t, int64_t, int64_t, int64_t, const int32_t*, \
                                           cudaStream_t);                                                           \
  template void flash_attention_backward<X>(const X*, const X*, const X*, const float*, X*, float*, int64_t,        \
                                            int64_t, int64_t, int64_t, const int32_t*, cudaStream_t);              \
  template void flash_attention_gqa_forward<X>(const X*, const X*, const X*, int64_t, int64_t, int64_t, X*, float*, \
                                               int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,                \
                                               const int32_t*, cudaStream_t);                                       \
  template void flash_attention_gqa_backward<X>(const X*, const X*, const X*, const X*, int64_t, int64_t, int64_t,  \
                                                const X*, const float*, X*, X*, X*, float*, int64_t, int64_t,       \
                                                int64_t, int64_t, int64_t, int64_t, const int32_t*, cudaStream_t);  \
  template void flash_attention_gqa_forward_at<X>(const X*, const X*, const X*, int64_t, int64_t, int64_t, X*,      \
                                                  float*, int64_t, int64_t, int64_t, const int32_t*, int64_t,       \
                                                  int64_t, int64_t, int64_t, const int32_t*, cudaStream_t);         \
  template void flash_attention_gqa_backward_at<X>(const X*, const X*, const X*, const X*, int64_t, int64_t,        \
                                                   int64_t, const X*, const float*, X*, X*, X*, float*, int64_t,    \
                                                   int64_t, int64_t, const int32_t*, int64_t, int64_t, int64_t,     \
                                                   int64_t, const int32_t*, cudaStream_t);
RELAY_CUDA_FOR_FLOAT_TYPES(INST)
#undef INST

}  // namespace relay::cuda
