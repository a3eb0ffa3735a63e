#pragma once
// The host side of an optimizer step: the gradient's squared norm for
// clipping and for the finiteness check (a NaN or an infinity anywhere
// makes it non-finite; first_non_finite then finds where), and
// optimizer_pass, which runs an optimizer type's range update
// (optim/optimizer.hpp) over one parameter on the workers. The element
// math is in math/optim.hpp; the built-in optimizers' serial ranges are
// here (AdamW with its AVX2 loop, AdamW8bit's blocks, SGD). `grad_scale`
// multiplies every gradient (clipping).
//
// A 16-bit parameter (Precision<BF16>) is updated through its f32 master
// weights: the pass runs on the masters with the gradient widened, and the
// stored weights become the new masters rounded to bf16 (through_masters).
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "../../math/optim.hpp"
#include "../../core/optim_state.hpp"
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
    // lr * (m / bc1) / (sqrt(v / bc2) + eps), left to right as math::adamw_param
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(lr, _mm256_div_ps(mi, bc1)), _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, bc2)), eps));
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, step));
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

// AdamW8bit over n elements from a block boundary, block by block, in f32:
// each block's absmaxes, codes, and the two maps (signed for m, unsigned
// for v).
template <class C>
void adamw8bit_range(C* p, const C* g, float* m_absmax, float* v_absmax, std::uint8_t* m_codes, std::uint8_t* v_codes,
                     std::int64_t n, const float* maps, const math::AdamWStep<float>& s, C grad_scale) {
  for (std::int64_t start = 0, b = 0; start < n; start += math::adam8bit_block, ++b) {
    const int len = static_cast<int>(start + math::adam8bit_block < n ? math::adam8bit_block : n - start);
    float pf[math::adam8bit_block], gf[math::adam8bit_block];
    for (int i = 0; i < len; ++i) {
      pf[i] = static_cast<float>(p[start + i]);
      gf[i] = static_cast<float>(g[start + i] * grad_scale);
    }
    math::adamw8bit_update_block(pf, gf, len, m_codes + start, v_codes + start, m_absmax + b, v_absmax + b, maps,
                                 maps + math::dynamic_map_size, s);
    for (int i = 0; i < len; ++i) p[start + i] = static_cast<C>(pf[i]);
  }
}

// SGD with momentum over elements [begin, end) (momentum_buf null: none).
template <class T>
void sgd_range(T* p, const T* g, float* momentum_buf, std::int64_t begin, std::int64_t end, const math::SgdStep<T>& s,
               T grad_scale) {
  for (std::int64_t i = begin; i < end; ++i) {
    if (momentum_buf == nullptr) {
      math::sgd_update(p[i], static_cast<T*>(nullptr), g[i] * grad_scale, s.lr, s.momentum, s.weight_decay);
    } else {
      T b = momentum_buf[i];
      math::sgd_update(p[i], &b, g[i] * grad_scale, s.lr, s.momentum, s.weight_decay);
      momentum_buf[i] = static_cast<float>(b);
    }
  }
}

// Worker w's share of n elements in whole groups of `align` (the last may be short).
inline Range aligned_share(std::int64_t n, std::int64_t align, int workers, int w) {
  const Range r = share(ceil_div(n, align), workers, w);
  return Range{r.begin * align < n ? r.begin * align : n, r.end * align < n ? r.end * align : n};
}

// A 16-bit parameter's n elements through their masters: each worker's
// share (whole groups of `align`), chunk by chunk, gradient widened onto
// the stack, then serial(master + i, g_chunk, i, count) updates the masters
// of [i, i + count), which are then stored rounded as the weights. (The
// gradient chunk is read before the weights are stored: w may be g.)
template <class H, class Serial>
void through_masters(H* w, float* master, const H* g, std::int64_t n, std::int64_t align, int workers, Serial&& serial) {
  constexpr std::int64_t chunk = 1024;
  team_for_this_cpu(workers, [&](int wk, int c) {
    const Range r = aligned_share(n, align, c, wk);
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

// Optimizer O's update of one parameter's n elements on `workers` workers:
// w its stored values, g its gradients (storage type T), master its f32
// master weights (a 16-bit T; null otherwise), state where its state lies
// (from a multiple of O::desc.align), table the model's shared tables.
template <Optimizer O, class T>
void optimizer_pass(T* w, float* master, const T* g, const StateAt& state, std::int64_t n,
                    const typename O::template Step<compute_t<T>>& s, compute_t<T> grad_scale, const float* table, int workers) {
  if constexpr (half_storage<T>) {
    detail::through_masters(w, master, g, n, O::desc.align, workers, [&](float* p, const float* gc, std::int64_t i, std::int64_t count) {
      O::update(p, gc, state.at(i), count, s, grad_scale, table);
    });
  } else {
    team_for_this_cpu(workers, [&](int wk, int c) {
      const Range r = detail::aligned_share(n, O::desc.align, c, wk);
      if (r.end > r.begin) O::update(w + r.begin, g + r.begin, state.at(r.begin), r.end - r.begin, s, grad_scale, table);
    });
  }
}

}  // namespace headroom::host
