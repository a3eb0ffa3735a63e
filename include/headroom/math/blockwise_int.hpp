#pragma once
// Symmetric block-wise absmax integer quantization (core/quant_format.hpp,
// BlockInt<Bits, Block>; as in LLM.int8()'s absmax scheme, Dettmers et al. 2022,
// arXiv:2208.07339, applied per block):
//   Int8: code = round(x / absmax * 127) in [-127, 127], one int8 per element;
//   Int4: code = round(x / absmax * 7)   in [-7, 7], two's-complement nibbles,
//         two per byte, the first element of a pair in the HIGH nibble (as NF4).
// One fp32 absmax per block; x = code * absmax / qmax. |x - deq| <= absmax / qmax / 2.
#include <cstdint>

#include "../core/config.hpp"
#include "block.hpp"

namespace headroom::math {

template <int Bits>
struct IntFormat {
  static_assert(Bits == 8 || Bits == 4, "IntFormat<Bits>: Bits must be 8 or 4");
  static constexpr int qmax = Bits == 8 ? 127 : 7;
};

// round half away from zero, clamped to [-qmax, qmax]
HEADROOM_HOST_DEVICE constexpr int int_quantize_value(float v_times_qmax, int qmax) {
  int q = static_cast<int>(v_times_qmax < 0.0f ? v_times_qmax - 0.5f : v_times_qmax + 0.5f);
  return q > qmax ? qmax : (q < -qmax ? -qmax : q);
}

HEADROOM_HOST_DEVICE constexpr int int4_unpack(const std::uint8_t* packed, std::int64_t i) {
  const std::uint8_t byte = packed[i >> 1];
  const int nib = (i & 1) == 0 ? (byte >> 4) : (byte & 0x0f);
  return nib >= 8 ? nib - 16 : nib;  // sign-extend the nibble
}

// Stores block b's absmax and returns the factor mapping it to qmax.
// x: (len) the block  absmax: (blocks)
HEADROOM_HOST_DEVICE inline float int_block_scale(const float* x, int len, int qmax, float* absmax, std::int64_t b) {
  const float amax = block_absmax(x, len);
  absmax[b] = amax;
  return amax > 0.0f ? qmax / amax : 0.0f;
}

// Int8. x: (n)  codes: (n)  absmax: (ceil(n/block))
HEADROOM_HOST_DEVICE inline void quantize_blockwise_int8(const float* x, std::int64_t n, int block, std::int8_t* codes,
                                                         float* absmax) {
  constexpr int qmax = IntFormat<8>::qmax;
  for (std::int64_t b = 0; b * block < n; ++b) {
    const std::int64_t start = b * block;
    const int len = block_length(n, block, b);
    const float s = int_block_scale(x + start, len, qmax, absmax, b);
    for (int i = 0; i < len; ++i) codes[start + i] = static_cast<std::int8_t>(int_quantize_value(x[start + i] * s, qmax));
  }
}

// codes: (n)  absmax: (ceil(n/block))  out: (n)
HEADROOM_HOST_DEVICE inline void dequantize_blockwise_int8(const std::int8_t* codes, const float* absmax, std::int64_t n,
                                                           int block, float* out) {
  constexpr float inv_qmax = 1.0f / IntFormat<8>::qmax;
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * (absmax[i / block] * inv_qmax);
}

// Int4. block must be even. x: (n)  packed: (ceil(n/2))  absmax: (ceil(n/block))
HEADROOM_HOST_DEVICE inline void quantize_blockwise_int4(const float* x, std::int64_t n, int block, std::uint8_t* packed,
                                                         float* absmax) {
  constexpr int qmax = IntFormat<4>::qmax;
  for (std::int64_t b = 0; b * block < n; ++b) {
    const std::int64_t start = b * block;
    const int len = block_length(n, block, b);
    const float s = int_block_scale(x + start, len, qmax, absmax, b);
    for (int i = 0; i < len; i += 2) {
      const int hi = int_quantize_value(x[start + i] * s, qmax);
      const int lo = i + 1 < len ? int_quantize_value(x[start + i + 1] * s, qmax) : 0;
      packed[(start + i) >> 1] = static_cast<std::uint8_t>(((hi & 0x0f) << 4) | (lo & 0x0f));
    }
  }
}

// packed: (ceil(n/2))  absmax: (ceil(n/block))  out: (n)
HEADROOM_HOST_DEVICE inline void dequantize_blockwise_int4(const std::uint8_t* packed, const float* absmax, std::int64_t n,
                                                           int block, float* out) {
  constexpr float inv_qmax = 1.0f / IntFormat<4>::qmax;
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(int4_unpack(packed, i)) * (absmax[i / block] * inv_qmax);
}

}  // namespace headroom::math
