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
// LLMInt8 is bitsandbytes' load_in_8bit (LLM.int8(), Dettmers et al. 2022):
// Int8 with one absmax per row (block 0 here: the row's length, resolved
// where the weight is made), and a forward that quantizes the input too, row
// by row, and multiplies in int8, except the input's outlier columns (some
// |x| >= threshold in the batch), which go through an f32 product with the
// matching weight columns (dequantized). The plan bounds the outlier columns
// (MaxOutliers): a batch with more is refused (host::outlier_bound_exceeded).
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
  // LLM.int8: the input is quantized row-wise and multiplied in int8; columns
  // holding an |x| >= outlier_threshold (> 0) go through an f32 product, at
  // most max_outliers of them per batch.
  bool vectorwise = false;
  float outlier_threshold = 0.0f;
  int max_outliers = 0;

  constexpr bool decomposed() const { return vectorwise && outlier_threshold > 0.0f; }
  // The format as a (rows, cols) weight holds it: block 0 means one block per row.
  constexpr QuantDesc for_row_length(std::int64_t cols) const {
    QuantDesc d = *this;
    if (d.block == 0) d.block = static_cast<int>(cols);
    if (d.vectorwise) d.max_outliers = d.decomposed() ? (d.max_outliers < cols ? d.max_outliers : static_cast<int>(cols)) : 0;
    return d;
  }

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

// LLM.int8(): Threshold is bitsandbytes' llm_int8_threshold (6.0 by default,
// as transformers'; Ratio<0> turns the decomposition off: every column in
// int8). MaxOutliers bounds the outlier columns of one batch's input: 256 by
// default (the paper finds them in a handful of hidden dimensions; the plan's
// scratch holds MaxOutliers column indices, or the row length if shorter).
template <class Threshold = Ratio<6>, int MaxOutliers = 256>
struct LLMInt8 {
  HEADROOM_REQUIRE(Threshold::num >= 0, "LLMInt8<Threshold, MaxOutliers>: the outlier threshold must not be negative (it is {}/{})",
                   Threshold::num, Threshold::den);
  HEADROOM_REQUIRE(MaxOutliers > 0, "LLMInt8<Threshold, MaxOutliers>: the bound on outlier columns must be positive (it is {})",
                   MaxOutliers);
  static constexpr QuantDesc desc{QuantKind::int8, 8, 0, false, 256, true, static_cast<float>(Threshold::value), MaxOutliers};
  static constexpr std::string_view name = "LLM.int8";
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
