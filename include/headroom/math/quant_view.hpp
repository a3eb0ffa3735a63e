#pragma once
// A quantized weight matrix where it lives (arena offsets turned into
// pointers), readable from host and device code.
//
// Buffers (sizes from QuantDesc, core/quant_format.hpp):
//   codes  : NF4 / Int4 two per byte (first element in the high nibble), Int8 one per byte
//   scales : one f32 absmax per block of `block` elements; with double
//            quantization (NF4DQ): [absmax2 f32 x ceil(blocks/256)] [offset f32] [codes u8 x blocks]
//            (floats first, so they stay aligned)
//   table  : the model's shared code tables: NF4's 16 values, then the
//            signed dynamic map (256) used by double quantization
#include <cstdint>

#include "../core/config.hpp"
#include "../core/quant_format.hpp"
#include "blockwise_int.hpp"
#include "nf4.hpp"

namespace headroom::math {

struct QuantView {
  QuantDesc q{};
  std::uint8_t* codes = nullptr;
  std::uint8_t* scales = nullptr;
  float* table = nullptr;  // model's code tables (see above)
  std::int64_t rows = 0, cols = 0;

  HEADROOM_HOST_DEVICE std::int64_t blocks() const { return rows * cols / q.block; }
  HEADROOM_HOST_DEVICE float* absmax() const { return reinterpret_cast<float*>(scales); }  // plain formats
  // double quantization parts
  HEADROOM_HOST_DEVICE float* absmax2() const { return reinterpret_cast<float*>(scales); }
  HEADROOM_HOST_DEVICE float* offset() const { return absmax2() + (blocks() + q.dq_block - 1) / q.dq_block; }
  HEADROOM_HOST_DEVICE std::uint8_t* dq_codes() const { return reinterpret_cast<std::uint8_t*>(offset() + 1); }
  HEADROOM_HOST_DEVICE const float* dq_map() const { return table + 16; }

  HEADROOM_HOST_DEVICE float block_absmax(std::int64_t b) const {
    if (!q.double_quant) return absmax()[b];
    return double_dequantize_absmax(dq_codes(), absmax2(), *offset(), dq_map(), b);
  }

  // Element (r, c) dequantized (f32). Blocks run along rows (block divides cols).
  HEADROOM_HOST_DEVICE float at(std::int64_t r, std::int64_t c) const {
    const std::int64_t i = r * cols + c;
    const float a = block_absmax(i / q.block);
    switch (q.kind) {
      case QuantKind::nf4: return nf4_code(nf4_unpack(codes, i)) * a;
      case QuantKind::int4: return static_cast<float>(int4_unpack(codes, i)) * (a / IntFormat<4>::qmax);
      case QuantKind::int8: return static_cast<float>(reinterpret_cast<const std::int8_t*>(codes)[i]) * (a / IntFormat<8>::qmax);
      case QuantKind::none: break;
    }
    return 0.0f;
  }
};

}  // namespace headroom::math
