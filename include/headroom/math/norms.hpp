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
// Reductions accumulate in T (pass double for reference checks). Rows are
// stored as S (T by default; the host engine's bf16): read with
// static_cast<T>, written with Store<S>::from (a 16-bit storage type
// specializes it to round).
#include <cmath>

#include "../core/config.hpp"

namespace headroom::math {

// The norms' epsilon: rms_norm_eps / layer_norm_epsilon of the Llama and GPT-2
// presets (config.json is checked against it, io/hf_config.hpp).
inline constexpr double norm_eps = 1e-5;

template <class S>
struct Store {
  template <class T>
  HEADROOM_HOST_DEVICE static S from(T v) {
    return static_cast<S>(v);
  }
};

// x, w, y: (d)  rstd: (1)
template <class T, class S>
HEADROOM_HOST_DEVICE inline void rmsnorm_forward(const S* x, const S* w, int d, T eps, S* y, T* rstd) {
  using std::sqrt;
  T ss = T(0);
  for (int i = 0; i < d; ++i) ss += static_cast<T>(x[i]) * static_cast<T>(x[i]);
  const T r = T(1) / sqrt(ss / T(d) + eps);
  for (int i = 0; i < d; ++i) y[i] = Store<S>::from(static_cast<T>(x[i]) * r * static_cast<T>(w[i]));
  *rstd = r;
}

// x, w, dy, dx, dw: (d)  rstd: saved by the forward. dx is written (added
// to when accumulate: the input's gradient already holds other terms), dw accumulated.
template <class T, class S>
HEADROOM_HOST_DEVICE inline void rmsnorm_backward(const S* x, const S* w, const S* dy, int d, T rstd, S* dx, S* dw,
                                                  bool accumulate = false) {
  const auto ld = [](S v) { return static_cast<T>(v); };
  T dot = T(0);  // sum(gw * xhat)
  for (int i = 0; i < d; ++i) dot += ld(dy[i]) * ld(w[i]) * ld(x[i]) * rstd;
  const T c = dot / T(d);
  for (int i = 0; i < d; ++i) {
    const T xhat = ld(x[i]) * rstd;
    const T g = rstd * (ld(dy[i]) * ld(w[i]) - xhat * c);
    dx[i] = Store<S>::from(accumulate ? ld(dx[i]) + g : g);
    if (dw != nullptr) dw[i] = Store<S>::from(ld(dw[i]) + ld(dy[i]) * xhat);
  }
}

// x, w, b, y: (d)  mean, rstd: (1). b may be null (no bias).
template <class T, class S>
HEADROOM_HOST_DEVICE inline void layernorm_forward(const S* x, const S* w, const S* b, int d, T eps, S* y, T* mean,
                                                   T* rstd) {
  using std::sqrt;
  const auto ld = [](S v) { return static_cast<T>(v); };
  T s = T(0);
  for (int i = 0; i < d; ++i) s += ld(x[i]);
  const T mu = s / T(d);
  T var = T(0);
  for (int i = 0; i < d; ++i) var += (ld(x[i]) - mu) * (ld(x[i]) - mu);
  const T r = T(1) / sqrt(var / T(d) + eps);
  for (int i = 0; i < d; ++i) y[i] = Store<S>::from((ld(x[i]) - mu) * r * ld(w[i]) + (b != nullptr ? ld(b[i]) : T(0)));
  *mean = mu;
  *rstd = r;
}

// x, w, dy, dx, dw, db: (d). dx is written (added to when accumulate); dw, db
// accumulated (either may be null).
template <class T, class S>
HEADROOM_HOST_DEVICE inline void layernorm_backward(const S* x, const S* w, const S* dy, int d, T mean, T rstd, S* dx,
                                                    S* dw, S* db, bool accumulate = false) {
  const auto ld = [](S v) { return static_cast<T>(v); };
  T sum_g = T(0), dot = T(0);
  for (int i = 0; i < d; ++i) {
    const T g = ld(dy[i]) * ld(w[i]);
    sum_g += g;
    dot += g * (ld(x[i]) - mean) * rstd;
  }
  const T mg = sum_g / T(d), mgx = dot / T(d);
  for (int i = 0; i < d; ++i) {
    const T xhat = (ld(x[i]) - mean) * rstd;
    const T g = rstd * (ld(dy[i]) * ld(w[i]) - mg - xhat * mgx);
    dx[i] = Store<S>::from(accumulate ? ld(dx[i]) + g : g);
    if (dw != nullptr) dw[i] = Store<S>::from(ld(dw[i]) + ld(dy[i]) * xhat);
    if (db != nullptr) db[i] = Store<S>::from(ld(db[i]) + ld(dy[i]));
  }
}

}  // namespace headroom::math
