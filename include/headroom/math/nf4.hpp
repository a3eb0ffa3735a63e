#pragma once
// NF4 (4-bit NormalFloat) block-wise quantization, as bitsandbytes stores it
// (QLoRA, Dettmers et al. 2023, arXiv:2305.14314; core/quant_format.hpp):
//   - 16 code values (normal quantiles normalized to [-1, 1], exact zero at 7);
//   - blocks of 64 consecutive elements, one fp32 absmax per block;
//   - code = nearest NF4 value to x / absmax;
//   - two codes per byte, the first element of a pair in the HIGH nibble.
// Double quantization (NF4DQ): the absmaxes, minus their mean (the offset), are
// quantized with the 8-bit signed dynamic map (math/dynamic_map.hpp) in blocks
// of 256 absmaxes, one fp32 absmax per such block.
#include <cstdint>

#include "../core/config.hpp"
#include "dynamic_map.hpp"

namespace headroom::math {

inline constexpr int nf4_block = 64;     // elements per absmax block
inline constexpr int nf4_dq_block = 256; // absmaxes per second-level block

// The 16 NF4 code values, as bitsandbytes' kernels hold them (float32).
HEADROOM_HOST_DEVICE constexpr float nf4_code(int i) {
  constexpr float table[16] = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
      -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
      0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
      0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  return table[i & 15];
}

// The midpoint between codes i and i + 1, in float: 0.5f * (code i + code i+1).
HEADROOM_HOST_DEVICE constexpr float nf4_midpoint(int i) {
  constexpr float mid[15] = {
      0.5f * (nf4_code(0) + nf4_code(1)),   0.5f * (nf4_code(1) + nf4_code(2)),   0.5f * (nf4_code(2) + nf4_code(3)),
      0.5f * (nf4_code(3) + nf4_code(4)),   0.5f * (nf4_code(4) + nf4_code(5)),   0.5f * (nf4_code(5) + nf4_code(6)),
      0.5f * (nf4_code(6) + nf4_code(7)),   0.5f * (nf4_code(7) + nf4_code(8)),   0.5f * (nf4_code(8) + nf4_code(9)),
      0.5f * (nf4_code(9) + nf4_code(10)),  0.5f * (nf4_code(10) + nf4_code(11)), 0.5f * (nf4_code(11) + nf4_code(12)),
      0.5f * (nf4_code(12) + nf4_code(13)), 0.5f * (nf4_code(13) + nf4_code(14)), 0.5f * (nf4_code(14) + nf4_code(15))};
  return mid[i];
}

// Index of the NF4 code nearest to v (v is x / absmax, in [-1, 1]): the
// number of midpoints at or below v, found in four comparisons (the
// midpoints increase). Ties (exact midpoints) go to the upper code; NaN
// gives code 0.
HEADROOM_HOST_DEVICE constexpr std::uint8_t nf4_quantize_value(float v) {
  int code = v >= nf4_midpoint(7) ? 8 : 0;
  code += v >= nf4_midpoint(code + 3) ? 4 : 0;
  code += v >= nf4_midpoint(code + 1) ? 2 : 0;
  code += v >= nf4_midpoint(code) ? 1 : 0;
  return static_cast<std::uint8_t>(code);
}

HEADROOM_HOST_DEVICE constexpr float nf4_dequantize_value(std::uint8_t code, float absmax) {
  return nf4_code(code) * absmax;
}

// Code of element i of a packed NF4 array: element 2k is the high nibble of byte k.
HEADROOM_HOST_DEVICE constexpr std::uint8_t nf4_unpack(const std::uint8_t* packed, std::int64_t i) {
  const std::uint8_t byte = packed[i >> 1];
  return (i & 1) == 0 ? static_cast<std::uint8_t>(byte >> 4) : static_cast<std::uint8_t>(byte & 0x0f);
}

// Quantize one block of len <= 64 elements; returns its absmax.
// x: (len)  packed: (ceil(len/2)) bytes, written whole (a missing last low nibble is 0)
HEADROOM_HOST_DEVICE inline float quantize_nf4_block(const float* x, int len, std::uint8_t* packed) {
  const float absmax = block_absmax(x, len);
  const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  for (int i = 0; i < len; i += 2) {
    const std::uint8_t hi = nf4_quantize_value(x[i] * inv);
    const std::uint8_t lo = i + 1 < len ? nf4_quantize_value(x[i + 1] * inv) : std::uint8_t{0};
    packed[i >> 1] = static_cast<std::uint8_t>((hi << 4) | lo);
  }
  return absmax;
}

// Quantize n elements in blocks of 64 (the last block may be shorter).
// x: (n)  packed: (ceil(n/2)) bytes  absmax: (ceil(n/64))
HEADROOM_HOST_DEVICE inline void quantize_block_nf4(const float* x, std::int64_t n, std::uint8_t* packed, float* absmax) {
  for (std::int64_t b = 0; b * nf4_block < n; ++b) {
    const std::int64_t start = b * nf4_block;
    const int len = block_length(n, nf4_block, b);
    absmax[b] = quantize_nf4_block(x + start, len, packed + start / 2);
  }
}

// Dequantize elements [0, n) of a packed NF4 array.
// packed: (ceil(n/2))  absmax: (ceil(n/64))  out: (n)
HEADROOM_HOST_DEVICE inline void dequantize_nf4(const std::uint8_t* packed, const float* absmax, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = nf4_dequantize_value(nf4_unpack(packed, i), absmax[i / nf4_block]);
}

// ---- double quantization of the absmaxes (bitsandbytes compress_statistics) ----
// offset = mean(absmax); (absmax - offset) is quantized block-wise (256 per block)
// with the signed dynamic map `map` (256 sorted floats, make_dynamic_map(true, map)).
// absmax: (nblocks)  q: (nblocks) codes  absmax2: (ceil(nblocks/256))  offset: (1)
HEADROOM_HOST_DEVICE inline void double_quantize_absmax(const float* absmax, std::int64_t nblocks, const float* map,
                                                        std::uint8_t* q, float* absmax2, float* offset) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < nblocks; ++i) sum += absmax[i];
  const float mean = nblocks > 0 ? static_cast<float>(sum / static_cast<double>(nblocks)) : 0.0f;
  *offset = mean;
  for (std::int64_t b = 0; b * nf4_dq_block < nblocks; ++b) {
    const std::int64_t start = b * nf4_dq_block;
    const std::int64_t end = start + nf4_dq_block < nblocks ? start + nf4_dq_block : nblocks;
    float amax = 0.0f;
    for (std::int64_t i = start; i < end; ++i) {
      const float c = absmax[i] - mean;
      const float a = c < 0.0f ? -c : c;
      amax = a > amax ? a : amax;
    }
    absmax2[b] = amax;
    const float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
    for (std::int64_t i = start; i < end; ++i) q[i] = dynamic_quantize_value((absmax[i] - mean) * inv, map);
  }
}

// The absmax of NF4 block i under double quantization.
HEADROOM_HOST_DEVICE inline float double_dequantize_absmax(const std::uint8_t* q, const float* absmax2, float offset,
                                                           const float* map, std::int64_t i) {
  return map[q[i]] * absmax2[i / nf4_dq_block] + offset;
}

}  // namespace headroom::math
