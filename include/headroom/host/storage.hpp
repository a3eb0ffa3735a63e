#pragma once
// The host engine's storage types and the type it computes in:
//
//   storage S   compute_t<S>
//   double      double          (gradient checks)
//   float       float
//   bf16        float           (Precision<BF16>: bf16 weights, activations and
//                                gradients; every sum, statistic and update in float)
//
// A kernel over S reads with widen(x) and writes with narrow<S>(v), which are
// the identity for float and double and round to nearest even for bf16.
#include <type_traits>

#include "bf16.hpp"

namespace headroom::host {

template <class S>
struct compute_type {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double>,
                "host: a storage type is float, double or bf16");
  using type = S;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <class S>
using compute_t = typename compute_type<S>::type;

constexpr float widen(float x) { return x; }
constexpr double widen(double x) { return x; }
constexpr float widen(bf16 x) { return to_float(x); }

template <class S>
constexpr S narrow(compute_t<S> v) {
  if constexpr (std::is_same_v<S, bf16>) return to_bf16(v);
  else return v;
}

}  // namespace headroom::host
