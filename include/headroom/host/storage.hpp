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
#include <cstdint>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../math/norms.hpp"
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

// The DType a storage type's buffers hold (checkpoints label them with it).
template <class S>
inline constexpr DType dtype_of_storage =
    std::is_same_v<S, bf16> ? DType::BF16 : std::is_same_v<S, double> ? DType::F64 : DType::F32;

constexpr float widen(float x) { return x; }
constexpr double widen(double x) { return x; }
constexpr float widen(bf16 x) { return to_float(x); }

template <class S>
constexpr S narrow(compute_t<S> v) {
  if constexpr (std::is_same_v<S, bf16>) return to_bf16(v);
  else return v;
}

// dst[0..n) = src[0..n) widened (exact)
inline void widen_row(const bf16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace headroom::host

// the shared row math (math/norms.hpp) writes bf16 rounded to nearest even
template <>
struct headroom::math::Store<headroom::host::bf16> {
  template <class T>
  static headroom::host::bf16 from(T v) {
    return headroom::host::to_bf16(static_cast<float>(v));
  }
};
