#pragma once
// Rotary position embedding (Su et al. 2021, arXiv:2104.09864), Llama / HF
// convention ("rotate_half"): element i is paired with i + d/2, for i < d/2,
//   inv_freq_i = theta^(-2i/d),  a = p * inv_freq_i
//   (x_i, x_{i+d/2}) <- (x_i cos a - x_{i+d/2} sin a,  x_{i+d/2} cos a + x_i sin a)
// The rotation is orthogonal: its inverse (rotation by -a) is also the backward.
#include <cmath>

#include "../core/config.hpp"

namespace headroom::math {

// Rotate one head vector in place for position p. x: (head_dim), head_dim even.
// inverse = true rotates by -a (undoes the forward; maps dy to dx).
template <class T>
HEADROOM_HOST_DEVICE inline void rope_rotate(T* x, int head_dim, int p, T theta = T(10000), bool inverse = false) {
  using std::cos;
  using std::pow;
  using std::sin;
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const T inv_freq = T(1) / pow(theta, T(2 * i) / T(head_dim));
    const T a = T(p) * inv_freq;
    const T c = cos(a);
    const T s = inverse ? -sin(a) : sin(a);
    const T x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace headroom::math
