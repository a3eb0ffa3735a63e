#pragma once
// host::f16: IEEE binary16 as the host engine stores it (Precision<F16>: sign,
// 5 exponent bits, 10 mantissa bits; normal from 2^-14 to 65504, subnormal
// down to 2^-24), and its conversions. float -> f16 rounds to nearest, ties
// to even (as the CPUs' F16C conversion and PyTorch's do), including into the
// subnormals; a value at or above 65520 (halfway to the next power of two,
// rounded up) becomes infinite; a NaN stays a NaN (quieted).
#include <bit>
#include <cstdint>

namespace headroom::host {

struct f16 {
  std::uint16_t bits = 0;
  constexpr bool operator==(const f16&) const = default;
  // exact: every f16 is a float (the other way is to_f16, which rounds)
  constexpr explicit operator float() const {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // infinity, NaN
    if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    // zero or subnormal: mantissa x 2^-24, exact in float
    const float v = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
};
static_assert(sizeof(f16) == 2);

constexpr float to_float(f16 h) { return static_cast<float>(h); }

constexpr f16 to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu))};  // NaN, quieted
  if (ax >= 0x38800000u) {  // at least 2^-14: a normal f16, or infinite
    if (ax >= 0x47800000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // 65536 and up (and infinity)
    // drop 13 mantissa bits, ties to even; a carry moves into the exponent (65520 and up: infinity)
    const std::uint32_t rounded = (ax + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    return f16{static_cast<std::uint16_t>(sign | (rounded - (112u << 10)))};
  }
  // below 2^-14: a subnormal (or zero) of 2^-24 steps; |f| x 2^24 < 1024 is exact in float
  const float scaled = std::bit_cast<float>(ax) * 16777216.0f;
  std::uint32_t q = static_cast<std::uint32_t>(scaled);
  const float rest = scaled - static_cast<float>(q);
  if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;  // 1024 is 2^-14's own encoding
  return f16{static_cast<std::uint16_t>(sign | q)};
}

// dst[0..n) = src[0..n) rounded to f16 (to_f16 each)
inline void narrow_row(const float* src, f16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_f16(src[i]);
}

}  // namespace headroom::host
