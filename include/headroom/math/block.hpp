#pragma once
// Helpers shared by the block-wise formats (NF4, Int8/Int4, the dynamic
// 8-bit map): the absmax of a block and the length of block b of n elements.
#include <cstdint>

#include "../core/config.hpp"

namespace headroom::math {

// max |x[i]| over x: (len)
HEADROOM_HOST_DEVICE inline float block_absmax(const float* x, std::int64_t len) {
  float amax = 0.0f;
  for (std::int64_t i = 0; i < len; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  return amax;
}

// Elements in block b of n elements cut into blocks of `block` (the last may be shorter).
HEADROOM_HOST_DEVICE constexpr int block_length(std::int64_t n, int block, std::int64_t b) {
  const std::int64_t rest = n - b * block;
  return static_cast<int>(rest < block ? rest : block);
}

}  // namespace headroom::math
