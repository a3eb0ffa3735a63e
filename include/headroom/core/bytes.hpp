#pragma once
// Byte quantities and the literals used in budget assertions:
//   static_assert(plan.peak_bytes() <= 24_GiB);
//   static_assert(fits<Run, 24_GiB>);   // plan/budget.hpp: names both numbers when it fails
#include <cstdint>

namespace headroom {

using bytes_t = std::int64_t;

inline namespace literals {
constexpr bytes_t operator""_KiB(unsigned long long v) { return static_cast<bytes_t>(v) << 10; }
constexpr bytes_t operator""_MiB(unsigned long long v) { return static_cast<bytes_t>(v) << 20; }
constexpr bytes_t operator""_GiB(unsigned long long v) { return static_cast<bytes_t>(v) << 30; }
constexpr bytes_t operator""_KB(unsigned long long v) { return static_cast<bytes_t>(v) * 1000; }
constexpr bytes_t operator""_MB(unsigned long long v) { return static_cast<bytes_t>(v) * 1000 * 1000; }
constexpr bytes_t operator""_GB(unsigned long long v) { return static_cast<bytes_t>(v) * 1000 * 1000 * 1000; }
}  // namespace literals

constexpr bytes_t align_up(bytes_t n, bytes_t a) { return (n + a - 1) / a * a; }
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// An integer ratio, for the few real-valued knobs a type carries (LoRA alpha,
// momentum): no floating-point template arguments.
template <std::int64_t Num, std::int64_t Den = 1>
struct Ratio {
  static_assert(Den > 0, "Ratio<Num, Den>: the denominator must be positive");
  static constexpr std::int64_t num = Num;
  static constexpr std::int64_t den = Den;
  static constexpr double value = static_cast<double>(Num) / static_cast<double>(Den);
};

}  // namespace headroom
