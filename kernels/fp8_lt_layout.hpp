// How an FP8 GEMM (core/fp8_scaling.hpp's operands) runs on cuBLASLt, decided on the host: the operands' layouts that
// cuBLASLt's FP8 kernels accept (NVIDIA's cublasLtMatmul FP8 rules: "TN" on Ada / Hopper, 16-byte alignment), and the
// scale layouts of its scale modes (SCALAR_32F; Hopper's VEC128_32F / BLK128x128_32F, as PyTorch's _scaled_mm passes
// DeepSeek-V3's 1 x 128 / 128 x 128 scales to them). Pure functions, unit-tested in tests/test_fp8.cpp.
#pragma once
#include <cstdint>

#include "core/fp8_scaling.hpp"

namespace relay {

// cuBLASLt's scale modes that Relay's tilings map to (cublasLtMatmulMatrixScale_t's SCALAR_32F, VEC128_32F,
// BLK128x128_32F).
enum class Fp8LtScale : uint8_t { scalar, vec128, blk128x128 };

// One operand as cuBLASLt reads it. cuBLASLt's FP8 kernels take both operands with k running along their stored
// rows (Relay's row-major a (m, k) and b stored (n, k), trans_b: column-major "TN"), so an operand stored the
// other way is first copied transposed (kernels/cuda/fp8_transpose.cuh). Its scales, when the mode is a block one,
// are then copied into cuBLASLt's layout for the operand as read, (outer rows r, k):
//   vec128 (1 x 128 tiles along k): (ceil(k / 128), r) row-major, the outer dimension contiguous;
//   blk128x128: (ceil(r / 128), round_up(ceil(k / 128), 4)) row-major, each row of k blocks padded to 4;
// from Relay's grid (fp8_grid of the operand as stored), read transposed when `scales_transpose`.
struct Fp8LtOperand {
  bool transpose = false;         // the codes are copied transposed first
  Fp8LtScale scale = Fp8LtScale::scalar;
  bool scales_copy = false;       // the scales need a copy (else Relay's grid is cuBLASLt's layout as it is)
  bool scales_transpose = false;  // the copy reads Relay's grid transposed
  int64_t scales_rows = 1, scales_cols = 1, scales_ld = 1;  // the copy: (rows, ld) f32, columns [cols, ld) zero
};

// The decision: cuBLASLt (lt) with these operands, or the plain Relay kernel (kernels/cuda/fp8_quantize.cuh's
// fp8_gemm) for the reason given.
struct Fp8LtPlan {
  bool lt = false;
  const char* reason = "";  // why not cuBLASLt (empty when lt)
  Fp8LtOperand a, b;
};

// What the decision reads: the GEMM y (m, n) = op(a) (m, k) @ op(b) (k, n) + beta * y as fp8_matmul takes it, the
// GPU's compute capability (major * 10 + minor) and the smallest alignment, in bytes, of the pointers (codes,
// scales, y) that cuBLASLt would read as they are.
struct Fp8LtProblem {
  int64_t m = 0, n = 0, k = 0;
  Fp8Format a_format = Fp8Format::e4m3, b_format = Fp8Format::e4m3;
  Fp8Tiling a_tiling = Fp8Tiling::tensor, b_tiling = Fp8Tiling::tensor;
  bool trans_a = false, trans_b = false;
  int sm = 0;
  uint32_t alignment = 0;
};

constexpr int64_t fp8_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// An operand's cuBLASLt form: stored (rows, cols) with its tiling, k along its rows (k_along_rows) or its columns.
// False when the tiling has no cuBLASLt mode with k along this dimension (1 x 128 tiles across k, which no FP8
// GEMM of Relay's makes).
constexpr bool fp8_lt_operand(Fp8Tiling t, int64_t rows, int64_t cols, bool k_along_rows, Fp8LtOperand& out) {
  out = Fp8LtOperand{};
  out.transpose = k_along_rows;  // cuBLASLt reads k along the columns of what it is given
  const int64_t r = k_along_rows ? cols : rows, k = k_along_rows ? rows : cols;  // the operand as read: (r, k)
  const int64_t kb = (k + kFp8Tile - 1) / kFp8Tile;
  switch (t) {
    case Fp8Tiling::tensor:
      out.scale = Fp8LtScale::scalar;
      return true;
    case Fp8Tiling::row_1x128:  // Relay's grid (rows, kb) when k runs along the columns; cuBLASLt's is (kb, rows)
      if (k_along_rows) return false;
      out.scale = Fp8LtScale::vec128;
      out.scales_copy = out.scales_transpose = true;
      out.scales_rows = kb, out.scales_cols = out.scales_ld = r;
      return true;
    case Fp8Tiling::col_128x1:  // Relay's grid (kb, cols) when k runs along the rows: cuBLASLt's layout for a^T
      if (!k_along_rows) return false;
      out.scale = Fp8LtScale::vec128;
      out.scales_rows = kb, out.scales_cols = out.scales_ld = r;
      return true;
    case Fp8Tiling::block_128x128: {  // Relay's grid (rb, kb), or (kb, rb) when k runs along the rows
      out.scale = Fp8LtScale::blk128x128;
      out.scales_transpose = k_along_rows;
      out.scales_rows = (r + kFp8Tile - 1) / kFp8Tile, out.scales_cols = kb, out.scales_ld = fp8_round_up(kb, 4);
      out.scales_copy = out.scales_transpose || out.scales_ld != out.scales_cols;
      return true;
    }
  }
  return false;
}

// The decision, in the order a reader would check it. cuBLASLt's FP8 GEMMs need sm_89 (Ada) or newer; E5M2 x E5M2
// has no kernel; every leading dimension a multiple of 16 and every pointer 16-byte aligned (m, n, k multiples of
// 16 make every leading dimension one, transposed copies included); the block scale modes are Hopper's (sm_90),
// all-e4m3 (DeepSeek-V3's recipe), and are not mixed with a per-tensor scale.
constexpr Fp8LtPlan fp8_lt_plan(const Fp8LtProblem& p) {
  Fp8LtPlan plan;
  const bool a_block = p.a_tiling != Fp8Tiling::tensor, b_block = p.b_tiling != Fp8Tiling::tensor;
  if (p.sm < 89) return plan.reason = "cuBLASLt FP8 GEMMs need sm_89 or newer", plan;
  if (p.a_format == Fp8Format::e5m2 && p.b_format == Fp8Format::e5m2)
    return plan.reason = "cuBLASLt has no e5m2 x e5m2 FP8 GEMM", plan;
  if (p.m % 16 != 0 || p.n % 16 != 0 || p.k % 16 != 0 || p.m == 0 || p.n == 0 || p.k == 0)
    return plan.reason = "m, n and k must be non-zero multiples of 16", plan;
  if (p.alignment % 16 != 0) return plan.reason = "an operand is not 16-byte aligned", plan;
  if (a_block != b_block) return plan.reason = "a per-tensor scale with a block-scaled operand", plan;
  if (a_block && p.sm / 10 != 9) return plan.reason = "cuBLASLt's 1 x 128 / 128 x 128 scale modes are Hopper's (sm_90)", plan;
  if (a_block && (p.a_format != Fp8Format::e4m3 || p.b_format != Fp8Format::e4m3))
    return plan.reason = "cuBLASLt's block scale modes take e4m3 operands", plan;
  // Relay's a (m, k) or, trans_a, stored (k, m): k along a's rows when trans_a. b (k, n), or (n, k) when trans_b:
  // k along b's rows unless trans_b.
  const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  if (!fp8_lt_operand(p.a_tiling, a_rows, a_cols, p.trans_a, plan.a) ||
      !fp8_lt_operand(p.b_tiling, b_rows, b_cols, !p.trans_b, plan.b))
    return plan.reason = "a tiling across k", plan;
  if (a_block && plan.a.scale == Fp8LtScale::blk128x128 && plan.b.scale == Fp8LtScale::blk128x128)
    return plan.reason = "cuBLASLt has no 128 x 128 x 128 x 128 block scale mode", plan;
  plan.lt = true;
  return plan;
}

}  // namespace relay
