#pragma once
// host::bf16: bfloat16 as the host engine stores it (the top 16 bits of an
// IEEE float: sign, 8 exponent bits, 7 mantissa bits), and its conversions.
// float -> bf16 rounds to nearest, ties to even (as PyTorch's and the CPUs'
// conversions do); a NaN stays a NaN (quieted), infinities stay infinite,
// and a float above bf16's largest finite value rounds to infinity.
#include <bit>
#include <cstdint>

namespace headroom::host {

struct bf16 {
  std::uint16_t bits = 0;
  constexpr bool operator==(const bf16&) const = default;
  // exact: every bf16 is a float (the other way is to_bf16, which rounds)
  constexpr explicit operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
};
static_assert(sizeof(bf16) == 2);

constexpr float to_float(bf16 h) { return static_cast<float>(h); }

constexpr bf16 to_bf16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // NaN, quieted
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                                       // ties to even
  return bf16{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

// dst[0..n) = src[0..n) rounded to bf16 (to_bf16 each)
inline void narrow_row(const float* src, bf16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

}  // namespace headroom::host
