#pragma once
// Optimizer element updates (optim/optimizer.hpp):
//   AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101; as torch.optim.AdamW):
//     p <- p * (1 - lr * wd)                      decoupled weight decay
//     m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2
//     p <- p - lr * (m / bc1) / (sqrt(v / bc2) + eps),  bc_k = 1 - b_k^step (step >= 1)
//   SGD with momentum (as torch.optim.SGD, dampening 0, not Nesterov):
//     g <- g + wd p ;  buf <- mu buf + g ;  p <- p - lr buf   (buf starts at 0)
//   AdamW8bit (Dettmers et al. 2022, arXiv:2110.02861, bitsandbytes blockwise
//     Adam): both moments stored as 8-bit codes of a dynamic map
//     (math/dynamic_map.hpp) with one fp32 absmax per block of 256. A block is
//     dequantized, updated in fp32 as AdamW, the parameter updated from the fp32
//     moments, and the moments requantized with their new absmax.
//     bitsandbytes uses the signed map for m and the unsigned map for v; the
//     caller passes both maps (they may be the same signed table).
//   Lion (Chen et al. 2023, arXiv:2302.06675, with decoupled weight decay):
//     c <- b1 m + (1 - b1) g ;  p <- p * (1 - lr * wd) - lr * sign(c)
//     m <- b2 m + (1 - b2) g                      (m starts at 0)
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"
#include "dynamic_map.hpp"

namespace headroom::math {

template <class T>
struct AdamWHyper {
  T lr = T(1e-3);
  T beta1 = T(0.9);
  T beta2 = T(0.999);
  T eps = T(1e-8);
  T weight_decay = T(0.01);
};

// The per-step constants of AdamW (computed once per step, not per element).
template <class T>
struct AdamWStep {
  T lr, beta1, beta2, eps, weight_decay;
  T bc1;  // 1 - beta1^step
  T bc2;  // 1 - beta2^step
};

template <class T>
HEADROOM_HOST_DEVICE inline AdamWStep<T> adamw_step(const AdamWHyper<T>& h, int step) {
  using std::pow;
  return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, T(1) - pow(h.beta1, T(step)), T(1) - pow(h.beta2, T(step))};
}

// The moment update of one element (shared by AdamW and AdamW8bit).
template <class T>
HEADROOM_HOST_DEVICE inline void adam_moments(T& m, T& v, T g, const AdamWStep<T>& s) {
  m = s.beta1 * m + (T(1) - s.beta1) * g;
  v = s.beta2 * v + (T(1) - s.beta2) * g * g;
}

// The parameter update of one element from its updated moments.
template <class T>
HEADROOM_HOST_DEVICE inline T adamw_param(T p, T m, T v, const AdamWStep<T>& s) {
  using std::sqrt;
  p *= T(1) - s.lr * s.weight_decay;
  return p - s.lr * (m / s.bc1) / (sqrt(v / s.bc2) + s.eps);
}

// One AdamW element.
template <class T>
HEADROOM_HOST_DEVICE inline void adamw_update(T& p, T& m, T& v, T g, const AdamWStep<T>& s) {
  adam_moments(m, v, g, s);
  p = adamw_param(p, m, v, s);
}

// The per-step constants of SGD with momentum.
template <class T>
struct SgdStep {
  T lr, momentum, weight_decay;
};

// One SGD-with-momentum element; momentum 0 needs no buffer (buf may be null).
template <class T>
HEADROOM_HOST_DEVICE inline void sgd_update(T& p, T* buf, T g, T lr, T momentum, T weight_decay) {
  g += weight_decay * p;
  if (buf != nullptr && momentum != T(0)) {
    *buf = momentum * *buf + g;
    g = *buf;
  }
  p -= lr * g;
}

// The per-step constants of Lion.
template <class T>
struct LionStep {
  T lr, beta1, beta2, weight_decay;
};

// One Lion element.
template <class T>
HEADROOM_HOST_DEVICE inline void lion_update(T& p, T& m, T g, const LionStep<T>& s) {
  const T c = s.beta1 * m + (T(1) - s.beta1) * g;
  p *= T(1) - s.lr * s.weight_decay;
  p -= c > T(0) ? s.lr : c < T(0) ? -s.lr : T(0);
  m = s.beta2 * m + (T(1) - s.beta2) * g;
}

inline constexpr int adam8bit_block = 256;

// One block (n <= 256 elements) of AdamW8bit, in place, without scratch memory:
// pass 1 computes the new moments' absmaxes, pass 2 recomputes the (identical)
// new moments, updates the parameters and requantizes the moments.
// p, g: (n)  m_codes, v_codes: (n)  m_absmax, v_absmax: (1) this block's
// map_m, map_v: (256) sorted dynamic maps
HEADROOM_HOST_DEVICE inline void adamw8bit_update_block(float* p, const float* g, int n, std::uint8_t* m_codes,
                                                        std::uint8_t* v_codes, float* m_absmax, float* v_absmax,
                                                        const float* map_m, const float* map_v, const AdamWStep<float>& s) {
  const float m_old_scale = *m_absmax, v_old_scale = *v_absmax;
  float m_amax = 0.0f, v_amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    float m = map_m[m_codes[i]] * m_old_scale, v = map_v[v_codes[i]] * v_old_scale;
    adam_moments(m, v, g[i], s);
    const float am = m < 0.0f ? -m : m;
    m_amax = am > m_amax ? am : m_amax;
    v_amax = v > v_amax ? v : v_amax;
  }
  const float m_inv = m_amax > 0.0f ? 1.0f / m_amax : 0.0f;
  const float v_inv = v_amax > 0.0f ? 1.0f / v_amax : 0.0f;
  for (int i = 0; i < n; ++i) {
    float m = map_m[m_codes[i]] * m_old_scale, v = map_v[v_codes[i]] * v_old_scale;
    adam_moments(m, v, g[i], s);
    p[i] = adamw_param(p[i], m, v, s);
    m_codes[i] = dynamic_quantize_value(m * m_inv, map_m);
    v_codes[i] = dynamic_quantize_value(v * v_inv, map_v);
  }
  *m_absmax = m_amax;
  *v_absmax = v_amax;
}

}  // namespace headroom::math
