#pragma once
// Which elements of a parameter a process holds and updates, for both
// engines' trainers: with ZeRO 1-3 each data-parallel rank updates its
// shard of every parameter (RunConfig::sharded; ParamSlot::shard elements,
// the last rank's cut at the parameter's end).
#include <algorithm>
#include <cstdint>
#include <utility>

#include "../graph/graph.hpp"

namespace headroom::trainers {

// Data parallelism (ZeRO 1-3): the elements of parameter p that rank `rank`
// updates (its shard, cut at the parameter's end: none past it) and where
// they start in its weight and gradient buffers (ZeRO 3 stores the weight's
// shard alone, ZeRO 2 and 3 the gradient's); without sharding, all of them.
struct Owned {
  std::int64_t begin = 0, count = 0, weight_at = 0, grad_at = 0;  // begin: the first element's index in the parameter
};
template <class Param>
constexpr Owned owned(const RunConfig& config, const Param& p, int rank) {
  if (!config.sharded(1)) return Owned{0, p.elements(), 0, 0};
  const std::int64_t begin = rank * p.shard;
  const std::int64_t count = std::clamp<std::int64_t>(p.elements() - begin, 0, p.shard);
  return Owned{begin, count, config.sharded(3) ? 0 : begin, config.sharded(2) ? 0 : begin};
}

// The bytes of a byte-stored tensor of `bytes` bytes (a quantized
// parameter's codes or scales) that rank `rank` holds, [begin, begin +
// count): with ZeRO 3 its byte shard (RunConfig::shard_bytes; none past the
// tensor's end), else all of them.
struct HeldBytes {
  std::int64_t begin = 0, count = 0;
};
constexpr HeldBytes held_bytes(const RunConfig& config, std::int64_t bytes, int rank) {
  if (!config.sharded(3)) return HeldBytes{0, bytes};
  const std::int64_t block = config.shard_bytes(bytes), begin = std::min(bytes, rank * block);
  return HeldBytes{begin, std::min(block, bytes - begin)};
}

// The gradient of p this rank holds once the data-parallel ranks averaged
// it, and its elements: the whole gradient, or with ZeRO 2 and 3 this
// rank's shard. What the update reads, what OffloadOptimizer streams to
// the offload tier, and what the processes that hold parts of one gradient
// sum before the update (a table both end stages hold; a LoRA matrix every
// tensor-parallel rank holds whole, ParamSlot::tensor_partial: the same
// elements on each of them).
template <class T, class Arena, class Param>
std::pair<T*, std::int64_t> held_gradient(const RunConfig& c, const Arena& arena, const Param& p) {
  return c.sharded(2) ? std::pair<T*, std::int64_t>{arena.template at<T>(p.grad_shard), p.shard}
                      : std::pair<T*, std::int64_t>{arena.template at<T>(p.grad), p.elements()};
}

}  // namespace headroom::trainers
