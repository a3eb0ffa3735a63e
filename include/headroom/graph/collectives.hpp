#pragma once
// The collectives of data parallelism as the builder emits them
// (graph/sharding.hpp): each one's name, lane and named operands, declared
// once. The op types that run them (ops/collectives.hpp) derive from these
// declarations and add their kernels, so the builder binds and the kernels
// read the same names, as for every other op.
//
// Q is a parameter's place among the op's parameters (ops::Weight<Q>, at
// most graph::max_weights of them): a collective serves the parameters of
// one op at once.
#include <string_view>

#include "operands.hpp"

namespace headroom::graph::collective {

// ZeRO 0 and 1: after the backward that completes a gradient, the gradient
// is summed over the ranks in place and divided by their count.
struct AllReduceGrads {
  static constexpr std::string_view name = "all_reduce_grads";
  static constexpr ops::Lane lane = ops::Lane::communication;
  template <int Q>
  static constexpr ops::Weight<Q> param{};  // the parameter whose gradient it averages
  template <int Q>
  static constexpr ops::In<Q> grad{};  // that gradient, averaged in place
  template <int Q>
  static constexpr ops::Dim<2 * Q> elements{};  // its elements
};

// ZeRO 2 and 3: the gradient, a bucket of one shard per rank, is divided by
// the ranks' count and reduce-scattered into this rank's shard.
struct ReduceScatterGrads {
  static constexpr std::string_view name = "reduce_scatter_grads";
  static constexpr ops::Lane lane = ops::Lane::communication;
  template <int Q>
  static constexpr ops::Weight<Q> param{};  // the parameter whose gradient it averages
  template <int Q>
  static constexpr ops::In<Q> bucket{};  // the whole gradient, padded to a shard per rank
  template <int Q>
  static constexpr ops::Out<Q> shard{};  // this rank's shard of the average
  template <int Q>
  static constexpr ops::Dim<2 * Q> elements{};  // the parameter's elements
  template <int Q>
  static constexpr ops::Dim<2 * Q + 1> shard_elements{};  // a shard's elements (RunConfig::shard)
};

// ZeRO 3: before an event that reads parameters, every rank's shard of them
// is gathered into buffers that live until that event.
struct AllGatherParams {
  static constexpr std::string_view name = "all_gather_params";
  static constexpr ops::Lane lane = ops::Lane::communication;
  template <int Q>
  static constexpr ops::Weight<Q> param{};  // the parameter gathered (its shard: the source)
  template <int Q>
  static constexpr ops::Out<Q> values{};  // its values (or quantized codes), gathered
  static constexpr ops::Out<2> scales{};  // a quantized parameter 0's scales, gathered
  template <int Q>
  static constexpr ops::Dim<Q> block{};  // bytes of one rank's block of values<Q>
  static constexpr ops::Dim<2> scales_block{};  // bytes of one rank's block of scales
};

}  // namespace headroom::graph::collective
