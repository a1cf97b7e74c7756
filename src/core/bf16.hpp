// bfloat16 storage (the upper 16 bits of an IEEE float32: 8-bit exponent, 7-bit mantissa), as
// torch.bfloat16 and CUDA's __nv_bfloat16 store it. Math is never done in bf16: values are widened to
// float, computed, and rounded back with round-to-nearest-even (torch's rounding; NaN stays NaN).
#pragma once
#include <cstdint>
#include <cstring>

namespace relay {

struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

inline float bf16_to_f32(bf16 x) {
  const uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  const uint32_t quiet_nan = (u >> 16) | 0x40u;                       // NaN stays NaN, sign kept
  // A select, not a branch, so that loops over arrays vectorise (signed compare: both sides < 2^31).
  return bf16{uint16_t(int32_t(u & 0x7fffffffu) > int32_t(0x7f800000u) ? quiet_nan : rounded)};
}

// Element loads and stores that kernels templated on the storage type (float or bf16) share:
// load widens to float, store rounds from float.
inline float load(float x) { return x; }
inline float load(bf16 x) { return bf16_to_f32(x); }
inline void store(float& dst, float v) { dst = v; }
inline void store(bf16& dst, float v) { dst = f32_to_bf16(v); }

// Rounds a float to the nearest bf16 value and back (what a bf16 round trip does to it).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// One step of a bf16 sum as the communicators form it: added in float, rounded to bf16 (an NCCL bf16 all-reduce's
// partial sums; the MPI user reduction and the reduce-scatter's local sum).
inline bf16 bf16_add(bf16 a, bf16 b) { return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b)); }

}  // namespace relay
