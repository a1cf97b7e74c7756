// A CPU model of the few CUDA features the tensor-core flash attention kernels use: one OS thread per CUDA thread,
// __syncthreads as a barrier of the block, warp collectives (ldmatrix, mma.sync, shfl) through a barrier of the warp.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

using std::min;
using std::max;
struct Idx { unsigned x = 0, y = 0, z = 0; };
inline thread_local Idx threadIdx, blockIdx;
struct WarpBox {
  std::barrier<> bar{32};
  const void* addr[32];
  uint32_t a[32][4], b[32][2];
  float c[32][4], f[32];
};
inline thread_local WarpBox* g_warp;
inline thread_local std::barrier<>* g_block;
inline unsigned char g_smem[256 * 1024];
inline int g_cp_mode = 0;  // 0: a cp.async lands at issue; 1: as late as allowed (at the wait that needs it)
struct Pending { void* dst; const void* src; bool valid; };
inline thread_local std::vector<std::vector<Pending>> g_groups;  // committed groups, oldest first
inline thread_local std::vector<Pending> g_open;

inline void __syncthreads() { g_block->arrive_and_wait(); }
inline int lane_id() { return threadIdx.x % 32; }

inline float __shfl_xor_sync(unsigned, float v, int m) {
  WarpBox& w = *g_warp;
  w.f[lane_id()] = v;
  w.bar.arrive_and_wait();
  const float r = w.f[lane_id() ^ m];
  w.bar.arrive_and_wait();
  return r;
}

typedef __nv_bfloat16 bf16;
inline uint16_t bits(const bf16* p) { uint16_t u; std::memcpy(&u, p, 2); return u; }

// ldmatrix .x4 (PTX ISA): lanes 8i..8i+7 give matrix i's row addresses (8 bf16 each); lane l receives, of matrix
// i, row l / 4 elements 2 (l % 4), +1 (trans: column l / 4, rows 2 (l % 4), +1), lower index in the low half.
template <bool TRANS>
inline void ldmatrix_x4(const bf16* p, uint32_t (&r)[4]) {
  WarpBox& w = *g_warp;
  const int l = lane_id();
  w.addr[l] = p;
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!TRANS) {
      const bf16* row = static_cast<const bf16*>(w.addr[8 * i + l / 4]);
      lo = bits(row + 2 * (l % 4));
      hi = bits(row + 2 * (l % 4) + 1);
    } else {
      lo = bits(static_cast<const bf16*>(w.addr[8 * i + 2 * (l % 4)]) + l / 4);
      hi = bits(static_cast<const bf16*>(w.addr[8 * i + 2 * (l % 4) + 1]) + l / 4);
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  w.bar.arrive_and_wait();
}

inline float lo_f(uint32_t v) { return __bfloat162float(__ushort_as_bfloat16(uint16_t(v & 0xffff))); }
inline float hi_f(uint32_t v) { return __bfloat162float(__ushort_as_bfloat16(uint16_t(v >> 16))); }

// mma.m16n8k16 row.col f32.bf16.bf16.f32 with the fragment layouts of the PTX ISA (g = lane / 4, c = lane % 4):
// A a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..); B b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g);
// C c0, c1 (g, 2c, 2c+1), c2, c3 (g+8, ...). Products summed over k in order, in double, rounded once to float.
inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  WarpBox& w = *g_warp;
  const int l = lane_id();
  for (int i = 0; i < 4; ++i) w.a[l][i] = a[i];
  w.b[l][0] = b0;
  w.b[l][1] = b1;
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int t = 0; t < 32; ++t) {
    const int g = t / 4, cc = t % 4;
    const uint32_t* x = w.a[t];
    A[g][2 * cc] = lo_f(x[0]); A[g][2 * cc + 1] = hi_f(x[0]);
    A[g + 8][2 * cc] = lo_f(x[1]); A[g + 8][2 * cc + 1] = hi_f(x[1]);
    A[g][2 * cc + 8] = lo_f(x[2]); A[g][2 * cc + 9] = hi_f(x[2]);
    A[g + 8][2 * cc + 8] = lo_f(x[3]); A[g + 8][2 * cc + 9] = hi_f(x[3]);
    B[2 * cc][g] = lo_f(w.b[t][0]); B[2 * cc + 1][g] = hi_f(w.b[t][0]);
    B[2 * cc + 8][g] = lo_f(w.b[t][1]); B[2 * cc + 9][g] = hi_f(w.b[t][1]);
  }
  w.bar.arrive_and_wait();
  const int g = l / 4, cc = l % 4;
  for (int j = 0; j < 4; ++j) {
    const int row = g + (j >= 2 ? 8 : 0), col = 2 * cc + (j & 1);
    double s = c[j];
    for (int k = 0; k < 16; ++k) s += double(A[row][k]) * double(B[k][col]);
    c[j] = float(s);
  }
}

inline void cp_land(const Pending& p) {
  if (p.valid) std::memcpy(p.dst, p.src, 16);
  else std::memset(p.dst, 0, 16);
}
inline void cp_async16(bf16* dst, const bf16* src, bool valid) {
  if (g_cp_mode == 0) cp_land({dst, src, valid});
  else g_open.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  g_groups.push_back(std::move(g_open));
  g_open.clear();
}
template <int N>
inline void cp_async_wait() {
  while (int(g_groups.size()) > N) {
    for (const Pending& p : g_groups.front()) cp_land(p);
    g_groups.erase(g_groups.begin());
  }
}

// kernel<<<grid, block>>>: blocks one after another, each as `threads` OS threads.
template <typename F>
void launch(unsigned gx, unsigned gy, int threads, F kernel) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      std::memset(g_smem, 0xcd, sizeof g_smem);  // garbage, as a GPU's shared memory holds
      std::barrier<> block(threads);
      std::vector<WarpBox> warps(size_t(threads / 32));
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx = {unsigned(t), 0, 0};
          blockIdx = {bx, by, 0};
          g_warp = &warps[size_t(t / 32)];
          g_block = &block;
          g_groups.clear();
          g_open.clear();
          kernel();
          if (!g_groups.empty() || !g_open.empty()) std::fprintf(stderr, "thread %d ended with copies in flight\n", t);
        });
      for (auto& th : ts) th.join();
    }
}
