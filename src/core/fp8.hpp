// FP8 storage: OCP's 8-bit floats (OCP FP8 spec 2023, arXiv:2209.05433) as torch.float8_e4m3fn / float8_e5m2 and
// CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 store them. e4m3 (bias 7): no infinities, max finite 448, NaN 0x7f / 0xff;
// e5m2 (bias 15): IEEE-like, max finite 57344, inf 0x7c / 0xfc. float -> fp8 rounds to nearest even and SATURATES
// (every |x| beyond max finite, infinities included, becomes +-max: PTX's cvt.rn.satfinite, which scaled-FP8
// recipes use); NaN stays NaN. fp8 -> float is exact. Math is never done in fp8: values are widened to float.
// The conversions are RELAY_HOST_DEVICE: the CPU and the CUDA kernels (kernels/cuda/fp8_quantize.cu) run this one
// definition, so the codes are the same bits on both.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/host_device.hpp"

namespace relay {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

// The constants of a format, for the conversions below and for recipes (scale = max_finite / amax).
struct Fp8Spec {
  int mantissa_bits;     // 3 | 2
  int bias;              // 7 | 15
  float max_finite;      // 448 | 57344
  uint8_t max_code;      // the code of +max_finite: 0x7e | 0x7b
  uint8_t nan_code;      // the positive NaN written for a NaN input: 0x7f | 0x7e (fp16's quiet NaN's top byte)
};
RELAY_HOST_DEVICE constexpr Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::e4m3 ? Fp8Spec{3, 7, 448.f, 0x7e, 0x7f} : Fp8Spec{2, 15, 57344.f, 0x7b, 0x7e};
}
constexpr const char* fp8_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

// The few steps whose spelling differs between the host and a CUDA kernel, each the same IEEE operation: a float's
// bits and back, a division and a product rounded to nearest (on the device __fdiv_rn / __fmul_rn, which no
// fast-math flag or contraction changes), and rounding to the nearest integer, ties to even (the host's nearbyintf
// in the default rounding mode, the device's rintf).
RELAY_HOST_DEVICE inline uint32_t fp8_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
RELAY_HOST_DEVICE inline float fp8_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
RELAY_HOST_DEVICE inline float fp8_div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
RELAY_HOST_DEVICE inline float fp8_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
RELAY_HOST_DEVICE inline float fp8_rint(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_nearbyintf(x);
#endif
}

// float -> fp8 code: round to nearest even, saturating (see the file's head). Branch-light integer arithmetic on
// the float's bits, so that the CPU and a CUDA kernel compute it alike.
RELAY_HOST_DEVICE inline uint8_t f32_to_fp8(float f, Fp8Format fmt) {
  const Fp8Spec s = fp8_spec(fmt);
  const uint32_t u = fp8_float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;  // |f|'s bits
  if (a > 0x7f800000u) return uint8_t(sign | s.nan_code);
  const int shift = 23 - s.mantissa_bits;
  const uint32_t min_normal = uint32_t(127 + 1 - s.bias) << 23;  // 2^(1 - bias), the smallest normal fp8
  uint32_t code;
  if (a >= min_normal) {
    // Keep the top mantissa bits, rounding the dropped ones to nearest even (a carry moves into the exponent, as it
    // should), then rebias the exponent from float's 127 to the format's bias. Infinity lands far above max_code.
    const uint32_t rounded = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
    code = rounded - (uint32_t(127 - s.bias) << s.mantissa_bits);
  } else {
    // Subnormal range: count steps of the smallest subnormal, 2^(1 - bias - mantissa_bits). |f| times that power of
    // two's inverse is exact; nearbyint rounds to nearest even (the default rounding mode). A result of
    // 2^mantissa_bits is the smallest normal, whose code is that same number.
    const float steps_per_unit = float(1u << (s.bias - 1 + s.mantissa_bits));  // 2^(bias - 1 + mantissa_bits)
    code = uint32_t(fp8_rint(fp8_mul_rn(fp8_bits_float(a), steps_per_unit)));
  }
  return uint8_t(sign | (code > s.max_code ? s.max_code : code));
}

// fp8 code -> float, exact (every fp8 value is a float).
RELAY_HOST_DEVICE inline float fp8_to_f32(uint8_t b, Fp8Format fmt) {
  const Fp8Spec s = fp8_spec(fmt);
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t mag = b & 0x7fu;
  const uint32_t exp = mag >> s.mantissa_bits, mant = mag & ((1u << s.mantissa_bits) - 1u);
  uint32_t u;
  if (fmt == Fp8Format::e4m3 && mag == 0x7fu) {
    u = sign | 0x7fc00000u;  // NaN
  } else if (fmt == Fp8Format::e5m2 && exp == 31) {
    u = sign | (mant == 0 ? 0x7f800000u : 0x7fc00000u);  // inf or NaN
  } else if (exp == 0) {
    // Subnormal: mant steps of 2^(1 - bias - mantissa_bits), exact in float.
    u = fp8_float_bits(fp8_div_rn(float(mant), float(1u << (s.bias - 1 + s.mantissa_bits)))) | sign;
  } else {
    u = sign | ((exp - uint32_t(s.bias) + 127u) << 23) | (mant << (23 - s.mantissa_bits));
  }
  return fp8_bits_float(u);
}

// The format's value of code b, for every code: a 256-entry table (kernels widen whole matrices through it).
struct Fp8Table {
  float value[256];
  explicit Fp8Table(Fp8Format fmt) {
    for (int b = 0; b < 256; ++b) value[b] = fp8_to_f32(uint8_t(b), fmt);
  }
};
inline const Fp8Table& fp8_table(Fp8Format fmt) {
  static const Fp8Table e4m3(Fp8Format::e4m3), e5m2(Fp8Format::e5m2);
  return fmt == Fp8Format::e4m3 ? e4m3 : e5m2;
}

}  // namespace relay
