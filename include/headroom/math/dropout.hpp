#pragma once
// Dropout masks from a counter-based generator: no mask is stored. Element i
// of a tensor is kept or dropped by a hash of (stream, i) alone, so the
// forward, a checkpointed block's recompute and the backward each regenerate
// the same mask where they need it, on the host or on the GPU, in any order
// and on any number of threads.
//
// The hash is SplitMix64 (Steele, Lea and Flood 2014, "Fast splittable
// pseudorandom number generators"; the generator of java.util.SplittableRandom):
// the i-th output of the SplitMix64 sequence seeded with `stream` is
// mix64(stream + (i + 1) * golden). Its top 24 bits are a uniform u in
// [0, 2^24); the element is dropped when u < threshold, threshold =
// floor(p * 2^24) for a drop probability p = num / den, and a kept element
// is scaled by 1 / (1 - p) (inverted dropout: the expected value is unchanged,
// as torch.nn.Dropout does in training).
//
// A stream names one use of dropout in one step: the run's key for the step
// (the seed, the step, the data-parallel rank: tensor-parallel ranks of one
// replica share it), the micro-batch and the op's place in the model (its
// node and Repeat instance), mixed by the same hash.
#include <cstdint>

#include "../core/config.hpp"

namespace headroom::math {

inline constexpr std::uint64_t splitmix_golden = 0x9E3779B97F4A7C15ull;

HEADROOM_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The step's key: one per (seed, step, data-parallel rank).
HEADROOM_HOST_DEVICE constexpr std::uint64_t dropout_step_key(std::uint64_t seed, std::int64_t step, int dp_rank) {
  std::uint64_t k = mix64(seed + splitmix_golden);
  k = mix64(k ^ static_cast<std::uint64_t>(step));
  return mix64(k ^ static_cast<std::uint32_t>(dp_rank));
}

// The stream of the op at (node, instance) in micro-batch `micro` of the
// step whose key is `key`.
HEADROOM_HOST_DEVICE constexpr std::uint64_t dropout_stream(std::uint64_t key, int micro, int node, int instance) {
  const std::uint64_t k = mix64(key ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(micro)) + 1) * splitmix_golden);
  return mix64(k ^ mix64(static_cast<std::uint64_t>(static_cast<std::uint32_t>(node)) << 32 |
                         static_cast<std::uint32_t>(instance)));
}

// floor(p * 2^24) for p = num / den, 0 <= num < den
HEADROOM_HOST_DEVICE constexpr std::uint32_t dropout_threshold(std::int64_t num, std::int64_t den) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(num) << 24) / static_cast<std::uint64_t>(den));
}

// Whether element i of the stream is kept.
HEADROOM_HOST_DEVICE constexpr bool dropout_keep(std::uint64_t stream, std::uint64_t i, std::uint32_t threshold) {
  return static_cast<std::uint32_t>(mix64(stream + (i + 1) * splitmix_golden) >> 40) >= threshold;
}

// A dropout as a kernel applies it: element (r, c) of a (rows, cols) tensor
// whose columns are columns [col0, col0 + cols) of a tensor `width` wide
// (tensor parallelism splits the columns; otherwise col0 = 0, width = cols)
// is element r * width + col0 + c of the stream.
struct Dropout {
  std::uint64_t stream = 0;
  std::uint32_t threshold = 0;  // 0: nothing dropped
  double scale = 1.0;           // 1 / (1 - p)
  std::int64_t col0 = 0, width = 0;

  HEADROOM_HOST_DEVICE constexpr bool active() const { return threshold != 0; }
  HEADROOM_HOST_DEVICE constexpr bool keep(std::int64_t r, std::int64_t c) const {
    return dropout_keep(stream, static_cast<std::uint64_t>(r * width + col0 + c), threshold);
  }
  // x's element (r, c) after dropout: 0, or x / (1 - p)
  template <class T>
  HEADROOM_HOST_DEVICE constexpr T apply(T x, std::int64_t r, std::int64_t c) const {
    return keep(r, c) ? x * static_cast<T>(scale) : T(0);
  }
};

}  // namespace headroom::math
