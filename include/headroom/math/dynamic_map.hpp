#pragma once
// The 8-bit dynamic (tree) quantization map of bitsandbytes
// (Dettmers 2016, "8-Bit Approximations for Parallelism in Deep Learning";
// Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization",
// arXiv:2110.02861; bitsandbytes.functional.create_dynamic_map with
// max_exponent_bits = 7, total_bits = 8), and block-wise quantization with it.
//
// Construction (create_dynamic_map): for i in 0..6 the interval [0.1, 1] is cut
// by linspace(0.1, 1, k + 1) into k = 2^i (signed) or 2^(i+1) (unsigned) bins;
// the bin midpoints scaled by 10^(i-6) are codes (and, signed, their negations);
// plus 0 and 1.0; the 256 values are sorted ascending. Here the values are
// computed in double and rounded to float once (torch computes them in float32,
// so a value may differ from bitsandbytes' table in the last bit).
// Quantization maps v = x / absmax in [-1, 1] to the index of the nearest value.
#include <cstdint>

#include "../core/config.hpp"
#include "block.hpp"

namespace headroom::math {

inline constexpr int dynamic_map_size = 256;

// map: (256) sorted ascending
HEADROOM_HOST_DEVICE inline void make_dynamic_map(bool is_signed, float* map) {
  constexpr int max_exponent_bits = 7;
  constexpr int non_sign_bits = 7;  // total_bits - 1
  int n = 0;
  double scale = 1e-6;  // 10^(-(max_exponent_bits - 1) + i)
  for (int i = 0; i < max_exponent_bits; ++i) {
    const int items = is_signed ? (1 << (i + non_sign_bits - max_exponent_bits))
                                : (1 << (i + non_sign_bits - max_exponent_bits + 1));
    const double step = 0.9 / items;  // linspace(0.1, 1, items + 1)
    for (int k = 0; k < items; ++k) {
      const double lo = 0.1 + step * k;
      const double hi = 0.1 + step * (k + 1);
      const double mean = 0.5 * (lo + hi);
      map[n++] = static_cast<float>(scale * mean);
      if (is_signed) map[n++] = static_cast<float>(-scale * mean);
    }
    scale *= 10.0;
  }
  map[n++] = 0.0f;
  map[n++] = 1.0f;
  while (n < dynamic_map_size) map[n++] = 0.0f;
  // insertion sort (256 values, once)
  for (int i = 1; i < dynamic_map_size; ++i) {
    const float v = map[i];
    int j = i - 1;
    while (j >= 0 && map[j] > v) {
      map[j + 1] = map[j];
      --j;
    }
    map[j + 1] = v;
  }
}

// Index of the value of `map` (256, sorted) nearest to v; ties go to the upper value.
HEADROOM_HOST_DEVICE inline std::uint8_t dynamic_quantize_value(float v, const float* map) {
  int lo = 0, hi = dynamic_map_size - 1;  // binary search: last index with map[i] <= v
  if (v <= map[0]) return 0;
  if (v >= map[hi]) return static_cast<std::uint8_t>(hi);
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (map[mid] <= v) lo = mid; else hi = mid;
  }
  return static_cast<std::uint8_t>((v - map[lo]) < (map[hi] - v) ? lo : hi);
}

// Block-wise quantization with the dynamic map: one absmax per block of `block`.
// x: (n)  codes: (n)  absmax: (ceil(n/block))
HEADROOM_HOST_DEVICE inline void quantize_blockwise_dynamic(const float* x, std::int64_t n, int block, const float* map,
                                                            std::uint8_t* codes, float* absmax) {
  for (std::int64_t b = 0; b * block < n; ++b) {
    const std::int64_t start = b * block;
    const std::int64_t end = start + block_length(n, block, b);
    const float amax = block_absmax(x + start, end - start);
    absmax[b] = amax;
    const float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
    for (std::int64_t i = start; i < end; ++i) codes[i] = dynamic_quantize_value(x[i] * inv, map);
  }
}

// codes: (n)  absmax: (ceil(n/block))  out: (n)
HEADROOM_HOST_DEVICE inline void dequantize_blockwise_dynamic(const std::uint8_t* codes, const float* absmax, std::int64_t n,
                                                              int block, const float* map, float* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / block];
}

}  // namespace headroom::math
