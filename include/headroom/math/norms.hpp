#pragma once
// One row of RMSNorm / LayerNorm, forward and backward.
//   RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467; Llama):
//     rstd = 1 / sqrt(mean(x^2) + eps),  y = x * rstd * w
//   LayerNorm (Ba et al. 2016, arXiv:1607.06450; GPT-2):
//     mean = mean(x), rstd = 1 / sqrt(mean((x - mean)^2) + eps),  y = (x - mean) * rstd * w + b
// The forward saves rstd (and mean) per row; the backward recomputes xhat from x.
// Backward (xhat = normalized x, gw = dy * w):
//   RMSNorm:   dx = rstd (gw - xhat mean(gw xhat))
//   LayerNorm: dx = rstd (gw - mean(gw) - xhat mean(gw xhat))
//   dw += dy xhat, db += dy  (accumulated over rows: the caller zeroes them)
// Reductions accumulate in T (pass double for reference checks).
#include <cmath>

#include "../core/config.hpp"

namespace headroom::math {

// x, w, y: (d)  rstd: (1)
template <class T>
HEADROOM_HOST_DEVICE inline void rmsnorm_forward(const T* x, const T* w, int d, T eps, T* y, T* rstd) {
  using std::sqrt;
  T ss = T(0);
  for (int i = 0; i < d; ++i) ss += x[i] * x[i];
  const T r = T(1) / sqrt(ss / T(d) + eps);
  for (int i = 0; i < d; ++i) y[i] = x[i] * r * w[i];
  *rstd = r;
}

// x, w, dy, dx, dw: (d)  rstd: saved by the forward. dx is written (added
// to when accumulate: the input's gradient already holds other terms), dw accumulated.
template <class T>
HEADROOM_HOST_DEVICE inline void rmsnorm_backward(const T* x, const T* w, const T* dy, int d, T rstd, T* dx, T* dw,
                                                  bool accumulate = false) {
  T dot = T(0);  // sum(gw * xhat)
  for (int i = 0; i < d; ++i) dot += dy[i] * w[i] * x[i] * rstd;
  const T c = dot / T(d);
  for (int i = 0; i < d; ++i) {
    const T xhat = x[i] * rstd;
    const T g = rstd * (dy[i] * w[i] - xhat * c);
    dx[i] = accumulate ? dx[i] + g : g;
    if (dw != nullptr) dw[i] += dy[i] * xhat;
  }
}

// x, w, b, y: (d)  mean, rstd: (1). b may be null (no bias).
template <class T>
HEADROOM_HOST_DEVICE inline void layernorm_forward(const T* x, const T* w, const T* b, int d, T eps, T* y, T* mean,
                                                   T* rstd) {
  using std::sqrt;
  T s = T(0);
  for (int i = 0; i < d; ++i) s += x[i];
  const T mu = s / T(d);
  T var = T(0);
  for (int i = 0; i < d; ++i) var += (x[i] - mu) * (x[i] - mu);
  const T r = T(1) / sqrt(var / T(d) + eps);
  for (int i = 0; i < d; ++i) y[i] = (x[i] - mu) * r * w[i] + (b != nullptr ? b[i] : T(0));
  *mean = mu;
  *rstd = r;
}

// x, w, dy, dx, dw, db: (d). dx is written (added to when accumulate); dw, db
// accumulated (either may be null).
template <class T>
HEADROOM_HOST_DEVICE inline void layernorm_backward(const T* x, const T* w, const T* dy, int d, T mean, T rstd, T* dx,
                                                    T* dw, T* db, bool accumulate = false) {
  T sum_g = T(0), dot = T(0);
  for (int i = 0; i < d; ++i) {
    const T g = dy[i] * w[i];
    sum_g += g;
    dot += g * (x[i] - mean) * rstd;
  }
  const T mg = sum_g / T(d), mgx = dot / T(d);
  for (int i = 0; i < d; ++i) {
    const T xhat = (x[i] - mean) * rstd;
    const T g = rstd * (dy[i] * w[i] - mg - xhat * mgx);
    dx[i] = accumulate ? dx[i] + g : g;
    if (dw != nullptr) dw[i] += dy[i] * xhat;
    if (db != nullptr) db[i] += dy[i];
  }
}

}  // namespace headroom::math
