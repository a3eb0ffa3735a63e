#pragma once
// The optimizer pass over one parameter's flat buffer (AdamW, AdamW8bit,
// SGD), and the gradient's squared norm for clipping and for the finiteness
// check (a NaN or an infinity anywhere makes it non-finite; first_non_finite
// then finds where). Element math in math/optim.hpp. `grad_scale` multiplies
// every gradient (clipping).
//
// A 16-bit parameter (Precision<BF16>) is updated through its f32 master
// weights: the pass runs on the masters with the gradient widened, and the
// stored weights become the new masters rounded to bf16 (the *_pass
// overloads taking `master`).
//
// State layouts (OptimDesc::state_bytes):
//   AdamW      [m f32 x n][v f32 x n]
//   AdamW8bit  [m absmax f32 x blocks][v absmax f32 x blocks][m codes u8 x n][v codes u8 x n]
//              blocks of 256; maps: the model's table [signed 256][unsigned 256]
//   SGD        [momentum buffer f32 x n] (none without momentum)
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "../../math/optim.hpp"
#include "../cpu.hpp"
#include "../for_this_cpu.hpp"
#include "../parallel.hpp"
#include "../storage.hpp"
#include "../target.hpp"

namespace headroom::host {

// In double, over 8 lanes (a fixed order: deterministic, and vectorized).
// A gradient read in pieces whose sizes are multiples of 8 (the last one
// aside) gives the same sum piece by piece: squared_norm_add into the same
// lanes, then squared_norm_total.
template <class T>
void squared_norm_add(const T* g, std::int64_t n, double (&lane)[8]) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(widen(g[i + l])) * static_cast<double>(widen(g[i + l]));
  for (; i < n; ++i) lane[0] += static_cast<double>(widen(g[i])) * static_cast<double>(widen(g[i]));
}
inline double squared_norm_total(const double (&lane)[8]) {
  double s = 0.0;
  for (double x : lane) s += x;
  return s;
}
template <class T>
double squared_norm(const T* g, std::int64_t n) {
  double lane[8] = {};
  squared_norm_add(g, n, lane);
  return squared_norm_total(lane);
}

// The index of the first NaN or infinite element of g, or -1. The failure
// path of the gradient check (the hot path only tests squared_norm's
// result): a plain loop that stops at the first hit.
template <class T>
std::int64_t first_non_finite(const T* g, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(widen(g[i]))) return i;
  return -1;
}

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
namespace detail::avx2 {
// AdamW over float elements [i, end), 8 at a time: math::adamw_update's
// operations in the same order (std::sqrt in a loop is not vectorized while
// it may set errno, and the scalar loop ran at a fifth of memory speed).
// Returns where it stopped; the caller finishes the tail.
inline std::int64_t adamw(float* p, const float* g, float* m, float* v, std::int64_t i, std::int64_t end,
                          const math::AdamWStep<float>& s, float grad_scale) {
  const __m256 b1 = _mm256_set1_ps(s.beta1), b2 = _mm256_set1_ps(s.beta2), c1 = _mm256_set1_ps(1.0f - s.beta1),
               c2 = _mm256_set1_ps(1.0f - s.beta2), bc1 = _mm256_set1_ps(s.bc1), bc2 = _mm256_set1_ps(s.bc2),
               eps = _mm256_set1_ps(s.eps), lr = _mm256_set1_ps(s.lr), decay = _mm256_set1_ps(1.0f - s.lr * s.weight_decay),
               scale = _mm256_set1_ps(grad_scale);
  for (; i + 8 <= end; i += 8) {
    const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), scale);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 step = _mm256_div_ps(_mm256_div_ps(mi, bc1), _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, bc2)), eps));
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lr, step)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  return i;
}
}  // namespace detail::avx2
HEADROOM_TARGET_END
#endif

namespace detail {
// AdamW over elements [begin, end), on the calling thread.
template <class T>
void adamw_range(T* p, const T* g, float* m, float* v, std::int64_t begin, std::int64_t end, const math::AdamWStep<T>& s,
                 T grad_scale) {
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (isa() >= Isa::avx2) begin = avx2::adamw(p, g, m, v, begin, end, s, grad_scale);
#endif
  for (std::int64_t i = begin; i < end; ++i) {
    T mi = m[i], vi = v[i];
    math::adamw_update(p[i], mi, vi, g[i] * grad_scale, s);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
  }
}

// A 16-bit parameter's n elements through their masters: each worker's
// range, chunk by chunk, gradient widened onto the stack, then
// serial(master + i, g_chunk, i, count) updates the masters of [i, i +
// count), which are then stored rounded as the weights.
template <class H, class Serial>
void through_masters(H* w, float* master, const H* g, std::int64_t n, int workers, Serial&& serial) {
  constexpr std::int64_t chunk = 1024;
  team_for_this_cpu(workers, [&](int wk, int c) {
    const Range r = share(n, c, wk);
    float gf[chunk];
    for (std::int64_t i = r.begin; i < r.end; i += chunk) {
      const std::int64_t m = r.end - i < chunk ? r.end - i : chunk;
      widen_row(g + i, gf, m);
      serial(master + i, gf, i, m);
      narrow_row(master + i, w + i, m);
    }
  });
}
}  // namespace detail

// m, v: the moments of these n elements (AdamW's state is [m x n][v x n]
// of the whole parameter; a range of it passes m + i, v + i).
template <class T>
void adamw_pass(T* p, const T* g, float* m, float* v, std::int64_t n, const math::AdamWStep<T>& s, T grad_scale, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(n, c, w);
    detail::adamw_range(p, g, m, v, r.begin, r.end, s, grad_scale);
  });
}
// through the f32 masters (above)
template <class H>
  requires half_storage<H>
void adamw_pass(H* w, float* master, const H* g, float* m, float* v, std::int64_t n, const math::AdamWStep<float>& s,
                float grad_scale, int workers) {
  detail::through_masters(w, master, g, n, workers, [&](float* p, const float* gc, std::int64_t i, std::int64_t count) {
    detail::adamw_range(p, gc, m + i, v + i, 0, count, s, grad_scale);
  });
}

template <class T>
void adamw_pass(T* p, const T* g, float* state, std::int64_t n, const math::AdamWStep<T>& s, T grad_scale, int workers) {
  adamw_pass(p, g, state, state + n, n, s, grad_scale, workers);
}

inline std::int64_t adam8bit_blocks(std::int64_t n) { return (n + math::adam8bit_block - 1) / math::adam8bit_block; }

// AdamW8bit's state of an n-element parameter, seen from element `from`
// (a multiple of the 256-element block): its blocks' absmaxes and its codes.
struct Adam8bitState {
  float* m_absmax;
  float* v_absmax;
  std::uint8_t* m_codes;
  std::uint8_t* v_codes;
  static Adam8bitState of(std::uint8_t* state, std::int64_t n, std::int64_t from = 0) {
    const std::int64_t blocks = adam8bit_blocks(n), b = from / math::adam8bit_block;
    float* m_absmax = reinterpret_cast<float*>(state);
    float* v_absmax = m_absmax + blocks;
    std::uint8_t* m_codes = reinterpret_cast<std::uint8_t*>(v_absmax + blocks);
    return Adam8bitState{m_absmax + b, v_absmax + b, m_codes + from, m_codes + n + from};
  }
};

// n elements from a block boundary, their state as Adam8bitState::of gives it.
// (master: a 16-bit parameter's f32 masters, which the blocks update; null otherwise)
template <class T>
void adamw8bit_pass(T* p, const T* g, Adam8bitState st, std::int64_t n, const float* maps, const math::AdamWStep<float>& s,
                    compute_t<T> grad_scale, int workers, float* master = nullptr) {
  parallel_for_this_cpu(adam8bit_blocks(n), workers, [&](std::int64_t b, int) {
    const std::int64_t start = b * math::adam8bit_block;
    const int len = static_cast<int>(start + math::adam8bit_block < n ? math::adam8bit_block : n - start);
    float pf[math::adam8bit_block], gf[math::adam8bit_block];
    for (int i = 0; i < len; ++i) {
      pf[i] = master != nullptr ? master[start + i] : static_cast<float>(p[start + i]);
      gf[i] = static_cast<float>(widen(g[start + i]) * grad_scale);
    }
    math::adamw8bit_update_block(pf, gf, len, st.m_codes + start, st.v_codes + start, st.m_absmax + b, st.v_absmax + b, maps,
                                 maps + 256, s);
    for (int i = 0; i < len; ++i) {
      if (master != nullptr) master[start + i] = pf[i];
      p[start + i] = narrow<T>(pf[i]);
    }
  });
}

// The whole parameter: its state as one buffer (the layout above).
template <class T>
void adamw8bit_pass(T* p, const T* g, std::uint8_t* state, std::int64_t n, const float* maps, const math::AdamWStep<float>& s,
                    compute_t<T> grad_scale, int workers) {
  adamw8bit_pass(p, g, Adam8bitState::of(state, n), n, maps, s, grad_scale, workers);
}

namespace detail {
template <class T>
void sgd_range(T* p, const T* g, float* momentum_buf, std::int64_t begin, std::int64_t end, T lr, T momentum, T weight_decay,
               T grad_scale) {
  for (std::int64_t i = begin; i < end; ++i) {
    if (momentum_buf == nullptr) {
      math::sgd_update(p[i], static_cast<T*>(nullptr), g[i] * grad_scale, lr, momentum, weight_decay);
    } else {
      T b = momentum_buf[i];
      math::sgd_update(p[i], &b, g[i] * grad_scale, lr, momentum, weight_decay);
      momentum_buf[i] = static_cast<float>(b);
    }
  }
}
}  // namespace detail

template <class T>
void sgd_pass(T* p, const T* g, float* momentum_buf, std::int64_t n, T lr, T momentum, T weight_decay, T grad_scale, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(n, c, w);
    detail::sgd_range(p, g, momentum_buf, r.begin, r.end, lr, momentum, weight_decay, grad_scale);
  });
}
// through the f32 masters (above)
template <class H>
  requires half_storage<H>
void sgd_pass(H* w, float* master, const H* g, float* momentum_buf, std::int64_t n, float lr, float momentum,
              float weight_decay, float grad_scale, int workers) {
  detail::through_masters(w, master, g, n, workers, [&](float* p, const float* gc, std::int64_t i, std::int64_t count) {
    detail::sgd_range(p, gc, momentum_buf != nullptr ? momentum_buf + i : nullptr, 0, count, lr, momentum, weight_decay,
                      grad_scale);
  });
}

}  // namespace headroom::host
