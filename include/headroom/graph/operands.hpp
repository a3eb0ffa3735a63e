#pragma once
// Names for an op's operands, and where an op runs.
//
// An op type (ops/op.hpp) names each operand once, as a constant of one of
// these tag types, and both sides use the names: the layer that emits the op
// binds tensors to them (op.input(Gelu::x, h)), and the op's kernels read
// them back from their engine's context (k[Gelu::x], k.grad(Gelu::x)):
//
//   static constexpr ops::In<0> x{};        // an input
//   static constexpr ops::Out<0> y{};       // an output
//   static constexpr ops::InOut acc{};      // a tensor updated in place
//   static constexpr ops::Saved<0> x_{};    // what backward reads again
//   static constexpr ops::Dim<0> features{};// a dimension (or any integer the op needs)
//   static constexpr ops::Weight<0> w{};    // a parameter it reads (and whose gradient backward writes)
//
// The index inside each tag is the slot the plan stores it in; a kernel never
// spells it.
#include <cstdint>

namespace headroom::ops {

template <int I>
struct In {
  static constexpr int index = I;
};
template <int I>
struct Out {
  static constexpr int index = I;
};
struct InOut {};
template <int I>
struct Saved {
  static constexpr int index = I;
};
template <int I>
struct Dim {
  static constexpr int index = I;
};
template <int I>
struct Weight {
  static constexpr int index = I;
};

// Where an engine runs an op's kernels. Every op of the built-in set computes
// on the compute lane (the host engine's worker threads; the CUDA engine's
// compute stream). The other lanes are for ops that move or update state
// beside the computation: a collective on a communication stream (data,
// tensor and pipeline parallelism), an optimizer pass on host threads while
// the device computes (model states offloaded to host memory). An engine
// that does not run a lane refuses, at compile time, a run that has an op on
// it.
enum class Lane : std::uint8_t { compute, communication, host_threads };

constexpr const char* name_of(Lane l) {
  switch (l) {
    case Lane::compute: return "compute";
    case Lane::communication: return "communication";
    case Lane::host_threads: return "host threads";
  }
  return "?";
}

}  // namespace headroom::ops
