#pragma once
// Element functions the host kernels run over whole rows: exp, tanh,
// sigmoid, GELU (tanh form) and its derivative, SiLU, for float computed here
// (Cody-Waite range reduction and Cephes' degree-5 polynomial for e^r on
// [-ln2/2, ln2/2], relative error about 1e-7), with no library call. The row
// helpers (gelu_rows, swiglu_rows, ..., cross_entropy_row) run 8 floats at a
// time with AVX2 + FMA where host::isa() has it (compiled for AVX2 whatever
// the build's flags, host/target.hpp): GCC does not vectorize the scalar forms (under its
// default -ftrapping-math the clamps' compares stay branches), and libm's
// scalar expf / tanhf cost 5-30 ns an element here, which kept GELU, SwiGLU
// and the LM head's softmax far below memory speed. The scalar forms finish
// the rows' tails and serve other targets; double (the gradient checks) uses
// the math/*.hpp definitions unchanged.
//
// Row reductions (max, sum) use 16 independent lanes: the order differs from
// a left-to-right sum but is fixed, so results stay deterministic.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "../math/activations.hpp"
#include "cpu.hpp"
#include "storage.hpp"
#include "target.hpp"

namespace headroom::host::vec {

// e^x for float, x clamped to [-87.3, 88.3] (finite and normal results:
// e^-87.3 is 1.2e-38, not 0, and e^88.3 2.2e38, not infinity; no caller needs
// more: softmax exponentiates z - max <= 0, tanh and sigmoid saturate long
// before). NaN is not propagated.
inline constexpr float exp_lo = -87.3f, exp_hi = 88.3f, exp_shift = 12582912.0f;  // 1.5 * 2^23
inline constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f, log2e = 1.44269504088896341f;
inline constexpr float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp(float x) {
  x = x < exp_lo ? exp_lo : x;
  x = x > exp_hi ? exp_hi : x;
  const float t = x * log2e + exp_shift;  // adding 1.5 * 2^23 rounds to an integer n, kept in t's low bits
  const float n = t - exp_shift;
  const float r = (x - n * ln2_hi) - n * ln2_lo;
  float p = exp_poly[0];
  for (int i = 1; i < 6; ++i) p = p * r + exp_poly[i];
  const float er = p * r * r + r + 1.0f;
  return er * std::bit_cast<float>((std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(exp_shift) + 127) << 23);
}
inline double exp(double x) { return std::exp(x); }

// tanh x = 1 - 2 / (e^2x + 1): absolute error ~1e-7 (relative error grows
// near 0, where GELU multiplies it by x).
template <class T>
inline T tanh(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f - 2.0f / (vec::exp(2.0f * x) + 1.0f);
  else return std::tanh(x);
}

template <class T>
inline T sigmoid(T x) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / (1.0f + vec::exp(-x));
  else return math::sigmoid(x);
}

// GELU, tanh form, and its derivative: math/activations.hpp's formulas.
template <class T>
inline T gelu_tanh(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    return 0.5f * x * (1.0f + vec::tanh(k * (x + c * x * x * x)));
  } else {
    return math::gelu_tanh(x);
  }
}
template <class T>
inline T gelu_tanh_grad(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    const float t = vec::tanh(k * (x + c * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
  } else {
    return math::gelu_tanh_grad(x);
  }
}

// h = silu(gate) * up, and its backward (math/activations.hpp's swiglu).
template <class T>
inline T swiglu(T gate, T up) {
  return gate * vec::sigmoid(gate) * up;
}
template <class T>
inline void swiglu_backward(T gate, T up, T dh, T& dgate, T& dup) {
  const T s = vec::sigmoid(gate);
  dup = dh * gate * s;
  dgate = dh * up * s * (T(1) + gate * (T(1) - s));
}

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
// The same functions on 8 floats (GCC does not vectorize the scalar forms:
// under -ftrapping-math the clamps' compares stay branches), and the row
// helpers' 8-wide loops: each returns how far it got, the caller finishes the
// tail with the scalar forms.
namespace avx2 {
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(exp_lo)), _mm256_set1_ps(exp_hi));
  const __m256 shift = _mm256_set1_ps(exp_shift);
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(log2e)), shift);
  const __m256 n = _mm256_sub_ps(t, shift);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(ln2_hi))), _mm256_mul_ps(n, _mm256_set1_ps(ln2_lo)));
  __m256 p = _mm256_set1_ps(exp_poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_poly[i]));
  const __m256 er = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shift)), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(er, _mm256_castsi256_ps(e));
}
inline __m256 tanh8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8(_mm256_add_ps(x, x));
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
}
inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
// tanh(k (x + c x^3))
inline __m256 gelu_inner8(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  return tanh8(_mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715f), x3))));
}
inline __m256 gelu8(__m256 x) {
  const __m256 half = _mm256_set1_ps(0.5f);
  return _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(_mm256_set1_ps(1.0f), gelu_inner8(x)));
}
inline __m256 gelu_grad8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  const __m256 t = gelu_inner8(x);
  const __m256 k = _mm256_set1_ps(0.7978845608028654f), c3 = _mm256_set1_ps(3.0f * 0.044715f);
  const __m256 a = _mm256_mul_ps(half, _mm256_add_ps(one, t));
  const __m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_sub_ps(one, _mm256_mul_ps(t, t))),
                                 _mm256_mul_ps(k, _mm256_add_ps(one, _mm256_mul_ps(c3, _mm256_mul_ps(x, x)))));
  return _mm256_add_ps(a, b);
}

inline std::int64_t gelu_rows(const float* x, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, gelu8(_mm256_loadu_ps(x + i)));
  return i;
}
inline std::int64_t gelu_backward_rows(const float* x, const float* dy, float* dx, bool first, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(dy + i), gelu_grad8(_mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(dx + i, first ? g : _mm256_add_ps(_mm256_loadu_ps(dx + i), g));
  }
  return i;
}
inline std::int64_t swiglu_rows(const float* gate, const float* up, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  return i;
}
inline std::int64_t swiglu_backward_rows(const float* gate, const float* up, const float* dh, float* dgate,
                                         bool dgate_first, float* dup, bool dup_first, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i), d = _mm256_loadu_ps(dh + i);
    const __m256 s = sigmoid8(g), one = _mm256_set1_ps(1.0f);
    if (dup != nullptr) {
      const __m256 v = _mm256_mul_ps(_mm256_mul_ps(d, g), s);
      _mm256_storeu_ps(dup + i, dup_first ? v : _mm256_add_ps(_mm256_loadu_ps(dup + i), v));
    }
    if (dgate != nullptr) {
      const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, u), s), _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s))));
      _mm256_storeu_ps(dgate + i, dgate_first ? v : _mm256_add_ps(_mm256_loadu_ps(dgate + i), v));
    }
  }
  return i;
}
// s[0, 16) = the 16 lanes' sums of e^(z - m) over the whole 16-chunks of z
inline std::int64_t sum_exp(const float* z, std::int64_t n, float m, float* s) {
  const __m256 mm = _mm256_set1_ps(m);
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  std::int64_t v = 0;
  for (; v + 16 <= n; v += 16) {
    a = _mm256_add_ps(a, exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v), mm)));
    b = _mm256_add_ps(b, exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v + 8), mm)));
  }
  _mm256_storeu_ps(s, a);
  _mm256_storeu_ps(s + 8, b);
  return v;
}
inline std::int64_t exp_scaled(float* z, std::int64_t n, float m, float scale) {
  std::int64_t v = 0;
  for (; v + 8 <= n; v += 8)
    _mm256_storeu_ps(z + v, _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(z + v), _mm256_set1_ps(m))), _mm256_set1_ps(scale)));
  return v;
}
}  // namespace avx2
HEADROOM_TARGET_END
#endif

// true where the 8-wide loops run (float only)
template <class T>
inline bool use_avx2() {
#if HEADROOM_X86_KERNELS
  return std::is_same_v<T, float> && isa() >= Isa::avx2;
#else
  return false;
#endif
}

// Whole rows: 8 elements at a time where AVX2 is chosen, the scalar forms
// for the rest (and for double).
// out[i] = gelu(x[i])
template <class T>
inline void gelu_rows(const T* x, T* out, std::int64_t n) {
  std::int64_t i = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) i = avx2::gelu_rows(x, out, n);
#endif
  for (; i < n; ++i) out[i] = vec::gelu_tanh(x[i]);
}

// dx[i] (+)= dy[i] gelu'(x[i])
template <class T>
inline void gelu_backward_rows(const T* x, const T* dy, T* dx, bool first, std::int64_t n) {
  std::int64_t i = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) i = avx2::gelu_backward_rows(x, dy, dx, first, n);
#endif
  for (; i < n; ++i) {
    const T g = dy[i] * vec::gelu_tanh_grad(x[i]);
    dx[i] = first ? g : dx[i] + g;
  }
}

// out[i] = silu(gate[i]) up[i]
template <class T>
inline void swiglu_rows(const T* gate, const T* up, T* out, std::int64_t n) {
  std::int64_t i = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) i = avx2::swiglu_rows(gate, up, out, n);
#endif
  for (; i < n; ++i) out[i] = vec::swiglu(gate[i], up[i]);
}

// dgate[i] (+)= dh up s (1 + gate (1 - s)), dup[i] (+)= dh gate s, s = sigmoid(gate); either may be null
template <class T>
inline void swiglu_backward_rows(const T* gate, const T* up, const T* dh, T* dgate, bool dgate_first, T* dup, bool dup_first,
                                 std::int64_t n) {
  std::int64_t i = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) i = avx2::swiglu_backward_rows(gate, up, dh, dgate, dgate_first, dup, dup_first, n);
#endif
  for (; i < n; ++i) {
    T dg, du;
    vec::swiglu_backward(gate[i], up[i], dh[i], dg, du);
    if (dgate != nullptr) dgate[i] = dgate_first ? dg : dgate[i] + dg;
    if (dup != nullptr) dup[i] = dup_first ? du : dup[i] + du;
  }
}

// 16-bit rows (a Precision<BF16> or <F16> run): chunks widened onto the
// stack, run by the float loops above, each result rounded once.
namespace detail {
inline constexpr std::int64_t half_chunk = 512;
// f(offset, count, float* in[Ins], float* out[Outs]) on widened chunks of the
// ins; each out chunk is narrowed into outs (or, where accumulating into it,
// widened first and added to by f).
template <int Ins, int Outs, class H, class F>
inline void half_chunks(std::int64_t n, const H* const (&ins)[Ins], H* const (&outs)[Outs], const bool (&read_out)[Outs], F&& f) {
  float in[Ins][half_chunk], out[Outs][half_chunk];
  for (std::int64_t i0 = 0; i0 < n; i0 += half_chunk) {
    const std::int64_t m = n - i0 < half_chunk ? n - i0 : half_chunk;
    for (int a = 0; a < Ins; ++a) widen_row(ins[a] + i0, in[a], m);
    for (int a = 0; a < Outs; ++a)
      if (outs[a] != nullptr && read_out[a]) widen_row(outs[a] + i0, out[a], m);
    f(m, in, out);
    for (int a = 0; a < Outs; ++a)
      if (outs[a] != nullptr) narrow_row(out[a], outs[a] + i0, m);
  }
}
using Chunk = float (*)[half_chunk];
}  // namespace detail

template <class H>
  requires half_storage<H>
void gelu_rows(const H* x, H* out, std::int64_t n) {
  detail::half_chunks<1, 1>(n, {x}, {out}, {false}, [](std::int64_t m, detail::Chunk in, detail::Chunk o) {
    gelu_rows(in[0], o[0], m);
  });
}
template <class H>
  requires half_storage<H>
void gelu_backward_rows(const H* x, const H* dy, H* dx, bool first, std::int64_t n) {
  detail::half_chunks<2, 1>(n, {x, dy}, {dx}, {!first}, [&](std::int64_t m, detail::Chunk in, detail::Chunk o) {
    gelu_backward_rows(in[0], in[1], o[0], first, m);
  });
}
template <class H>
  requires half_storage<H>
void swiglu_rows(const H* gate, const H* up, H* out, std::int64_t n) {
  detail::half_chunks<2, 1>(n, {gate, up}, {out}, {false}, [](std::int64_t m, detail::Chunk in, detail::Chunk o) {
    swiglu_rows(in[0], in[1], o[0], m);
  });
}
template <class H>
  requires half_storage<H>
void swiglu_backward_rows(const H* gate, const H* up, const H* dh, H* dgate, bool dgate_first, H* dup, bool dup_first,
                          std::int64_t n) {
  detail::half_chunks<3, 2>(n, {gate, up, dh}, {dgate, dup}, {!dgate_first, !dup_first},
                            [&](std::int64_t m, detail::Chunk in, detail::Chunk o) {
                              swiglu_backward_rows(in[0], in[1], in[2], dgate != nullptr ? o[0] : nullptr, dgate_first,
                                                   dup != nullptr ? o[1] : nullptr, dup_first, m);
                            });
}

inline constexpr int lanes = 16;

// max over z[0, n), n >= 1
template <class T>
inline T row_max(const T* z, std::int64_t n) {
  T m[lanes];
  for (int l = 0; l < lanes; ++l) m[l] = z[0];
  std::int64_t v = 0;
  for (; v + lanes <= n; v += lanes)
    for (int l = 0; l < lanes; ++l) m[l] = z[v + l] > m[l] ? z[v + l] : m[l];
  for (; v < n; ++v) m[0] = z[v] > m[0] ? z[v] : m[0];
  T r = m[0];
  for (int l = 1; l < lanes; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// sum of e^(z - m) over z[0, n)
template <class T>
inline T sum_exp(const T* z, std::int64_t n, T m) {
  T s[lanes] = {};
  std::int64_t v = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) v = avx2::sum_exp(z, n, m, s);
#endif
  for (; v + lanes <= n; v += lanes)
    for (int l = 0; l < lanes; ++l) s[l] += vec::exp(z[v + l] - m);
  for (; v < n; ++v) s[0] += vec::exp(z[v] - m);
  T r = T(0);
  for (int l = 0; l < lanes; ++l) r += s[l];
  return r;
}

// z = e^(z - m) * scale, in place (a softmax's gradient, scaled).
template <class T>
inline void exp_scaled(T* z, std::int64_t n, T m, T scale) {
  std::int64_t v = 0;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>)
    if (use_avx2<T>()) v = avx2::exp_scaled(z, n, m, scale);
#endif
  for (; v < n; ++v) z[v] = vec::exp(z[v] - m) * scale;
}

// Cross-entropy of one row of logits, its gradient in place: the formulas
// of math/cross_entropy.hpp with the vectorized exp and reductions.
template <class T>
inline T cross_entropy_row(T* z, std::int64_t vocab, std::int32_t target, T grad_scale, bool gradient) {
  const T m = row_max(z, vocab);
  const T s = sum_exp(z, vocab, m);
  const T loss = m + std::log(s) - z[target];
  if (gradient) {
    exp_scaled(z, vocab, m, grad_scale / s);
    z[target] -= grad_scale;
  }
  return loss;
}

}  // namespace headroom::host::vec
