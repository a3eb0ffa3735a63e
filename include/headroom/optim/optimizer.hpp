#pragma once
// Optimizers as types: what state they keep per trainable element.
//
// AdamW keeps two f32 moments per element (Loshchilov & Hutter 2019).
// AdamW8bit keeps both moments block-wise dynamically quantized to 8 bits
// (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"):
// one byte per element and moment, one f32 absmax per block of 256, plus the
// two shared 256-entry dynamic code tables (signed map for the first moment,
// unsigned for the second, as bitsandbytes; see math/dynamic_map.hpp). SGD with momentum keeps one f32 buffer
// (none when the momentum is zero).
#include <cstdint>
#include <string_view>

#include "../core/bytes.hpp"

namespace headroom {

enum class OptimKind : std::uint8_t { sgd, adamw, adamw8bit };

constexpr std::string_view name_of(OptimKind k) {
  switch (k) {
    case OptimKind::sgd: return "SGD";
    case OptimKind::adamw: return "AdamW";
    case OptimKind::adamw8bit: return "AdamW8bit";
  }
  return "?";
}

struct OptimDesc {
  OptimKind kind = OptimKind::adamw;
  int states = 2;           // state tensors per parameter
  bool blockwise8 = false;  // states stored as 8-bit codes + f32 absmax per block
  int block = 256;

  constexpr std::int64_t state_bytes(std::int64_t n) const {
    if (blockwise8) return states * (n + ceil_div(n, block) * 4);
    return states * n * 4;
  }
  // the two 256-entry f32 dynamic maps: signed for the first moment, unsigned for the second
  constexpr std::int64_t table_bytes() const { return blockwise8 ? 2 * 256 * 4 : 0; }
};

template <class Momentum = Ratio<9, 10>, class WeightDecay = Ratio<0>>
struct SGD {
  using momentum = Momentum;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = "SGD";
  static constexpr OptimDesc desc{OptimKind::sgd, Momentum::num != 0 ? 1 : 0, false, 256};
};

// Adam with decoupled weight decay; EightBit stores both moments block-wise
// quantized to 8 bits.
template <bool EightBit, class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<999, 1000>, class WeightDecay = Ratio<1, 100>>
struct AdamFamily {
  using beta1 = Beta1;
  using beta2 = Beta2;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = EightBit ? "AdamW8bit" : "AdamW";
  static constexpr OptimDesc desc{EightBit ? OptimKind::adamw8bit : OptimKind::adamw, 2, EightBit, 256};
};

template <class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<999, 1000>, class WeightDecay = Ratio<1, 100>>
using AdamWith = AdamFamily<false, Beta1, Beta2, WeightDecay>;
template <class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<999, 1000>, class WeightDecay = Ratio<1, 100>>
using Adam8bitWith = AdamFamily<true, Beta1, Beta2, WeightDecay>;

using AdamW = AdamWith<>;
using AdamW8bit = Adam8bitWith<>;

template <class O>
concept Optimizer = requires {
  { O::desc } -> std::convertible_to<OptimDesc>;
  { O::name } -> std::convertible_to<std::string_view>;
};

}  // namespace headroom
