#pragma once
// Block-wise quantization formats of frozen base weights (Quantized<Q, L>).
//
// NF4 follows bitsandbytes (QLoRA, Dettmers et al. 2023): 16 NormalFloat code
// values, blocks of 64 consecutive elements of the row-major matrix, one fp32
// absmax per block, two codes per byte with the first element in the high
// nibble. With double quantization the absmaxes are themselves quantized to
// 8 bits (bitsandbytes' dynamic map) in blocks of 256, with one fp32 absmax per
// such block and one fp32 offset (the mean subtracted before quantizing).
// Int8 / Int4 are symmetric block-wise absmax formats (code = round(x / absmax * 127)
// resp. * 7), one fp32 absmax per block.
#include <cstdint>
#include <string_view>

#include "bytes.hpp"
#include "diagnostic.hpp"

namespace headroom {

enum class QuantKind : std::uint8_t { none, int8, int4, nf4 };

// The lowered, integer-only description of a format (usable in kernels).
struct QuantDesc {
  QuantKind kind = QuantKind::none;
  int bits = 0;
  int block = 0;              // elements per absmax block
  bool double_quant = false;  // absmaxes quantized to 8 bits (NF4 only)
  int dq_block = 256;         // absmaxes per second-level block

  constexpr std::int64_t code_bytes(std::int64_t n) const { return n * bits / 8; }
  // Bytes of the per-block scaling state for n elements.
  constexpr std::int64_t scale_bytes(std::int64_t n) const {
    const std::int64_t blocks = n / block;
    if (!double_quant) return blocks * 4;
    return blocks * 1 + ceil_div(blocks, dq_block) * 4 + 4;
  }
  // Shared constant tables the format reads (code values), in bytes.
  constexpr std::int64_t table_bytes() const {
    if (kind == QuantKind::nf4) return 16 * 4 + (double_quant ? 256 * 4 : 0);
    return 0;
  }
};

template <int Block = 64, bool DoubleQuant = false>
struct NormalFloat4 {
  HEADROOM_REQUIRE(Block > 0 && Block % 2 == 0, "NF4: the block size must be a positive even number (it is {})", Block);
  static constexpr QuantDesc desc{QuantKind::nf4, 4, Block, DoubleQuant, 256};
  static constexpr std::string_view name = DoubleQuant ? "NF4+DQ" : "NF4";
};

template <int Bits, int Block = 64>
struct BlockInt {
  HEADROOM_REQUIRE(Bits == 8 || Bits == 4, "BlockInt<Bits, Block>: Bits must be 8 or 4 (it is {})", Bits);
  HEADROOM_REQUIRE(Block > 0 && Block % 2 == 0, "BlockInt: the block size must be a positive even number (it is {})", Block);
  static constexpr QuantDesc desc{Bits == 8 ? QuantKind::int8 : QuantKind::int4, Bits, Block, false, 256};
  static constexpr std::string_view name = Bits == 8 ? "Int8" : "Int4";
};

using NF4 = NormalFloat4<64, false>;
using NF4DQ = NormalFloat4<64, true>;
using Int8 = BlockInt<8, 64>;
using Int4 = BlockInt<4, 64>;

template <class Q>
concept QuantFormat = requires {
  { Q::desc } -> std::convertible_to<QuantDesc>;
  { Q::name } -> std::convertible_to<std::string_view>;
};

}  // namespace headroom
