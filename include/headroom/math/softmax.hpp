#pragma once
// Online (streaming) softmax statistics (Milakov & Gimelshein 2018,
// arXiv:1805.02867; FlashAttention, Dao et al. 2022, arXiv:2205.14135):
// a running maximum m and sum s = sum_j exp(x_j - m), updated one value or one
// chunk at a time; log-sum-exp = m + log(s). When m grows, everything
// accumulated against the old m (s, and in attention the output row) is scaled
// by exp(m_old - m_new): `update` / `merge` return that factor.
// Used by flash attention (per query row) and chunked cross-entropy (per token).
#include <cmath>
#include <limits>

#include "../core/config.hpp"

namespace headroom::math {

template <class T>
struct OnlineSoftmax {
  T m = -std::numeric_limits<T>::infinity();  // running max
  T s = T(0);                                 // sum of exp(x - m)

  // Add one value; returns the factor the caller's accumulators must be scaled by.
  HEADROOM_HOST_DEVICE T update(T x) {
    using std::exp;
    if (x > m) {
      const T scale = m == -std::numeric_limits<T>::infinity() ? T(0) : exp(m - x);
      s = s * scale + T(1);
      m = x;
      return scale;
    }
    s += exp(x - m);
    return T(1);
  }

  // Add a chunk x: (n) values.
  HEADROOM_HOST_DEVICE T update(const T* x, int n) {
    T scale = T(1);
    for (int i = 0; i < n; ++i) scale *= update(x[i]);
    return scale;
  }

  // Combine with the statistics of another part of the row; returns the factor
  // for this side's accumulators (the other side's factor is other_scale).
  HEADROOM_HOST_DEVICE T merge(const OnlineSoftmax& o, T* other_scale = nullptr) {
    using std::exp;
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    const T mn = m > o.m ? m : o.m;
    const T a = m == ninf ? T(0) : exp(m - mn);
    const T b = o.m == ninf ? T(0) : exp(o.m - mn);
    s = s * a + o.s * b;
    m = mn;
    if (other_scale != nullptr) *other_scale = b;
    return a;
  }

  HEADROOM_HOST_DEVICE T lse() const {
    using std::log;
    return m + log(s);
  }

  // softmax probability of value x under the final statistics
  HEADROOM_HOST_DEVICE T prob(T x) const {
    using std::exp;
    return exp(x - m) / s;
  }
};

}  // namespace headroom::math
