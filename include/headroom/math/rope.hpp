#pragma once
// Rotary position embedding (Su et al. 2021, arXiv:2104.09864), Llama / HF
// convention ("rotate_half"): element i is paired with i + d/2, for i < d/2,
//   inv_freq_i = theta^(-2i/d),  a = p * inv_freq_i
//   (x_i, x_{i+d/2}) <- (x_i cos a - x_{i+d/2} sin a,  x_{i+d/2} cos a + x_i sin a)
// The rotation is orthogonal: its inverse (rotation by -a) is also the backward.
//
// Llama 3.1's scaling (config.json rope_scaling with rope_type "llama3"; Llama
// 3.1 and 3.2) stretches the low frequencies to a context `factor` times the
// original: with wavelength w_i = 2 pi / inv_freq_i and L = the original context,
//   w_i < L / high_freq_factor   inv_freq_i unchanged (the fast pairs)
//   w_i > L / low_freq_factor    inv_freq_i / factor   (the slow pairs)
//   otherwise                    (1 - s) inv_freq_i / factor + s inv_freq_i,
//                                s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/real.hpp"

namespace headroom::math {

// Llama 3.1's RoPE scaling, as the kernels take it; original_positions 0: none.
struct RopeScaling {
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_positions = 0;  // original_max_position_embeddings

  constexpr bool on() const { return original_positions > 0; }
};

// The same as a template argument (models::LlamaConfig, Attention): its
// factors as Real. value() is what the kernels take.
struct RopeScalingConfig {
  Real factor = real(1);
  Real low_freq_factor = real(1);
  Real high_freq_factor = real(4);
  std::int64_t original_positions = 0;  // 0: none

  constexpr bool on() const { return original_positions > 0; }
  constexpr RopeScaling value() const { return {factor, low_freq_factor, high_freq_factor, original_positions}; }
};

// inv_freq_i of pair i of a head of head_dim elements, in double.
HEADROOM_HOST_DEVICE inline double rope_inv_freq(int i, int head_dim, double theta, const RopeScaling& s = {}) {
  const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (!s.on()) return inv_freq;
  constexpr double two_pi = 6.283185307179586476925286766559;
  const double wavelength = two_pi / inv_freq, context = static_cast<double>(s.original_positions);
  if (wavelength < context / s.high_freq_factor) return inv_freq;
  if (wavelength > context / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// Rotate one head vector in place for position p. x: (head_dim), head_dim even.
// inverse = true rotates by -a (undoes the forward; maps dy to dx).
template <class T>
HEADROOM_HOST_DEVICE inline void rope_rotate(T* x, int head_dim, int p, T theta = T(10000), bool inverse = false,
                                             const RopeScaling& scaling = {}) {
  using std::cos;
  using std::pow;
  using std::sin;
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const T inv_freq = scaling.on() ? T(rope_inv_freq(i, head_dim, static_cast<double>(theta), scaling))
                                    : T(1) / pow(theta, T(2 * i) / T(head_dim));
    const T a = T(p) * inv_freq;
    const T c = cos(a);
    const T s = inverse ? -sin(a) : sin(a);
    const T x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace headroom::math
