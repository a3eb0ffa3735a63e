#pragma once
// The host engine's storage types and the type it computes in:
//
//   storage S   compute_t<S>
//   double      double          (gradient checks)
//   float       float
//   bf16        float           (Precision<BF16>: bf16 weights, activations and
//                                gradients; every sum, statistic and update in float)
//   f16         float           (Precision<F16>: the same with IEEE half; its loss
//                                is scaled, train/loss_scaling.hpp)
//
// A kernel over S reads with widen(x) and writes with narrow<S>(v), which are
// the identity for float and double and round to nearest even for the two
// 16-bit types (half_storage<S>).
#include <cstdint>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../math/norms.hpp"
#include "bf16.hpp"
#include "f16.hpp"

namespace headroom::host {

// bf16 or f16: 16-bit storage computed in float
template <class S>
inline constexpr bool half_storage = std::is_same_v<S, bf16> || std::is_same_v<S, f16>;

template <class S>
struct compute_type {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double> || half_storage<S>,
                "host: a storage type is float, double, bf16 or f16");
  using type = std::conditional_t<half_storage<S>, float, S>;
};
template <class S>
using compute_t = typename compute_type<S>::type;

// The DType a storage type's buffers hold (checkpoints label them with it).
template <class S>
inline constexpr DType dtype_of_storage =
    std::is_same_v<S, bf16> ? DType::BF16 : std::is_same_v<S, f16> ? DType::F16 : std::is_same_v<S, double> ? DType::F64 : DType::F32;

// No arithmetic on the 16-bit storage types: an expression such as
// x[i] * g[j] on bf16 (or f16) says what to write instead of failing with a
// bare "no match for operator*" (and T(2) is not 2: it is the bits 0x0002).
namespace storage_detail {
template <class A, class B>
inline constexpr bool mentions_half = half_storage<std::remove_cvref_t<A>> || half_storage<std::remove_cvref_t<B>>;
template <class>
inline constexpr bool always_false = false;
}  // namespace storage_detail
// (The result type keeps the expression around it well-formed, so that this
// message is the first error.)
#define HEADROOM_HALF_STORAGE_NO_ARITHMETIC(op, result)                                                                  \
  template <class A, class B>                                                                                          \
    requires storage_detail::mentions_half<A, B>                                                                       \
  result operator op(A&& a, B&&) {                                                                                     \
    static_assert(storage_detail::always_false<A>,                                                                     \
                  "host: bf16 and f16 are storage types without arithmetic: a host kernel over T computes in "         \
                  "compute_t<T> (float), reading a stored value with widen(x) and writing one with narrow<T>(v) "     \
                  "(host/storage.hpp)");                                                                               \
    return static_cast<result>(a);                                                                                     \
  }
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(+, std::remove_cvref_t<A>)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(-, std::remove_cvref_t<A>)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(*, std::remove_cvref_t<A>)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(/, std::remove_cvref_t<A>)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(+=, A&&)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(-=, A&&)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(*=, A&&)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(/=, A&&)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(<, bool)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(>, bool)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(<=, bool)
HEADROOM_HALF_STORAGE_NO_ARITHMETIC(>=, bool)
#undef HEADROOM_HALF_STORAGE_NO_ARITHMETIC

constexpr float widen(float x) { return x; }
constexpr double widen(double x) { return x; }
constexpr float widen(bf16 x) { return to_float(x); }
constexpr float widen(f16 x) { return to_float(x); }

template <class S>
constexpr S narrow(compute_t<S> v) {
  if constexpr (std::is_same_v<S, bf16>) return to_bf16(v);
  else if constexpr (std::is_same_v<S, f16>) return to_f16(v);
  else return v;
}

// dst[0..n) = src[0..n) widened (exact)
template <class H>
  requires half_storage<H>
void widen_row(const H* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace headroom::host

// the shared row math (math/norms.hpp) writes bf16 and f16 rounded to nearest even
template <>
struct headroom::math::Store<headroom::host::bf16> {
  template <class T>
  static headroom::host::bf16 from(T v) {
    return headroom::host::to_bf16(static_cast<float>(v));
  }
};
template <>
struct headroom::math::Store<headroom::host::f16> {
  template <class T>
  static headroom::host::f16 from(T v) {
    return headroom::host::to_f16(static_cast<float>(v));
  }
};
