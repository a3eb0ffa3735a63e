#pragma once
// Cross-entropy of one row of logits, and its gradient in place:
//   lse = log sum_v exp(z_v);  loss = lse - z_target
//   dz_v = (softmax(z)_v - [v == target]) * grad_scale
// The max is subtracted before exponentiating (the row's scale does not
// matter to softmax). Used per token by the fused, chunked LM head + loss of
// both engines (host/kernels/lm_head.hpp).
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"

namespace headroom::math {

// z: (V) logits, overwritten by dz when `gradient`; returns the row's loss.
template <class T>
HEADROOM_HOST_DEVICE inline T cross_entropy_row(T* z, std::int64_t vocab, std::int32_t target, T grad_scale, bool gradient) {
  using std::exp;
  using std::log;
  T m = z[0];
  for (std::int64_t v = 1; v < vocab; ++v) m = z[v] > m ? z[v] : m;
  T s = T(0);
  for (std::int64_t v = 0; v < vocab; ++v) s += exp(z[v] - m);
  const T loss = m + log(s) - z[target];
  if (gradient) {
    const T inv = grad_scale / s;
    for (std::int64_t v = 0; v < vocab; ++v) z[v] = exp(z[v] - m) * inv;
    z[target] -= grad_scale;
  }
  return loss;
}

}  // namespace headroom::math
