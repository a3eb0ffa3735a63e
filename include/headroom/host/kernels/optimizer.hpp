#pragma once
// The optimizer pass over one parameter's flat buffer (AdamW, AdamW8bit,
// SGD), and the gradient's squared norm for clipping. Element math in
// math/optim.hpp. `grad_scale` multiplies every gradient (clipping).
//
// State layouts (OptimDesc::state_bytes):
//   AdamW      [m f32 x n][v f32 x n]
//   AdamW8bit  [m absmax f32 x blocks][v absmax f32 x blocks][m codes u8 x n][v codes u8 x n]
//              blocks of 256; maps: the model's table [signed 256][unsigned 256]
//   SGD        [momentum buffer f32 x n] (none without momentum)
#include <cstdint>

#include "../../math/optim.hpp"
#include "../parallel.hpp"

namespace headroom::host {

template <class T>
double squared_norm(const T* g, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
  return s;
}

template <class T>
void adamw_pass(T* p, const T* g, float* state, std::int64_t n, const math::AdamWStep<T>& s, T grad_scale, int workers) {
  float* m = state;
  float* v = state + n;
  team(workers, [&](int w, int c) {
    const Range r = share(n, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) {
      T mi = m[i], vi = v[i];
      math::adamw_update(p[i], mi, vi, g[i] * grad_scale, s);
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
    }
  });
}

inline std::int64_t adam8bit_blocks(std::int64_t n) { return (n + math::adam8bit_block - 1) / math::adam8bit_block; }

template <class T>
void adamw8bit_pass(T* p, const T* g, std::uint8_t* state, std::int64_t n, const float* maps, const math::AdamWStep<float>& s,
                    T grad_scale, int workers) {
  const std::int64_t blocks = adam8bit_blocks(n);
  float* m_absmax = reinterpret_cast<float*>(state);
  float* v_absmax = m_absmax + blocks;
  std::uint8_t* m_codes = reinterpret_cast<std::uint8_t*>(v_absmax + blocks);
  std::uint8_t* v_codes = m_codes + n;
  parallel_for(blocks, workers, [&](std::int64_t b, int) {
    const std::int64_t start = b * math::adam8bit_block;
    const int len = static_cast<int>(start + math::adam8bit_block < n ? math::adam8bit_block : n - start);
    float pf[math::adam8bit_block], gf[math::adam8bit_block];
    for (int i = 0; i < len; ++i) {
      pf[i] = static_cast<float>(p[start + i]);
      gf[i] = static_cast<float>(g[start + i] * grad_scale);
    }
    math::adamw8bit_update_block(pf, gf, len, m_codes + start, v_codes + start, m_absmax + b, v_absmax + b, maps, maps + 256, s);
    for (int i = 0; i < len; ++i) p[start + i] = static_cast<T>(pf[i]);
  });
}

template <class T>
void sgd_pass(T* p, const T* g, float* momentum_buf, std::int64_t n, T lr, T momentum, T weight_decay, T grad_scale, int workers) {
  team(workers, [&](int w, int c) {
    const Range r = share(n, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) {
      if (momentum_buf == nullptr) {
        math::sgd_update(p[i], static_cast<T*>(nullptr), g[i] * grad_scale, lr, momentum, weight_decay);
      } else {
        T b = momentum_buf[i];
        math::sgd_update(p[i], &b, g[i] * grad_scale, lr, momentum, weight_decay);
        momentum_buf[i] = static_cast<float>(b);
      }
    }
  });
}

}  // namespace headroom::host
