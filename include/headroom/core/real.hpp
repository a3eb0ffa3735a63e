#pragma once
// Real: a double held as the bits of its representation, for the numbers of a
// configuration that is a template argument (models::LlamaConfig's
// rms_norm_eps and RoPE scaling factors, RMSNorm's epsilon). A class with a
// double member is no template argument for clang before 18, nor is a double;
// an aggregate of one integer is, on every compiler the project supports
// (nvcc included, which spells template arguments back as braced lists).
//
//   constexpr Real eps = real(1e-6);   double(eps) == 1e-6, exactly
#include <bit>
#include <cstdint>

namespace headroom {

struct Real {
  std::int64_t bits = 0;  // std::bit_cast of the double

  constexpr operator double() const { return std::bit_cast<double>(bits); }
};

constexpr Real real(double x) { return Real{std::bit_cast<std::int64_t>(x)}; }

}  // namespace headroom
