#pragma once
// The float GEMM's AVX-512 register tile: 12 rows x 32 columns of C in 24
// zmm accumulators (two per row), run by sgemm/pack.hpp's driver. Per k: two
// loads of B's packed sliver, twelve broadcasts of A's, 24 FMAs. The
// arithmetic per element of C is the AVX2 tile's (one FMA per k, in order;
// alpha and beta applied as there): both kernels give the same bits.
#include <cstdint>
#include <cstring>

#include "../target.hpp"
#include "pack.hpp"

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX512_BEGIN
namespace headroom::host::sgemm::avx512 {

constexpr std::int64_t mr = 12, nr = 32;

// p[0..16) = alpha acc + beta p[0..16)   (beta 0: p is not read)
inline void put(float* p, __m512 acc, __m512 va, __m512 vb, int mode) {
  if (mode == 0) _mm512_storeu_ps(p, _mm512_mul_ps(va, acc));
  else if (mode == 1) _mm512_storeu_ps(p, _mm512_fmadd_ps(va, acc, _mm512_loadu_ps(p)));
  else _mm512_storeu_ps(p, _mm512_fmadd_ps(va, acc, _mm512_mul_ps(vb, _mm512_loadu_ps(p))));
}

// C (m x n, m <= 12, n <= 32) = alpha a b + beta C for one sliver of A
// (kb x 12) and one of B (kb x 32).
inline void tile(std::int64_t kb, const float* __restrict a, const float* __restrict b, float* c, std::int64_t ldc,
                 std::int64_t m, std::int64_t n, float alpha, float beta) {
  for (std::int64_t r = 0; r < m; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + nr - 1), _MM_HINT_T0);
  }
  __m512 acc[2 * mr];
#pragma GCC unroll 24
  for (int i = 0; i < 2 * mr; ++i) acc[i] = _mm512_setzero_ps();
  for (std::int64_t k = 0; k < kb; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * mr), _MM_HINT_T0);
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < mr; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r]);
      acc[2 * r] = _mm512_fmadd_ps(ar, b0, acc[2 * r]);
      acc[2 * r + 1] = _mm512_fmadd_ps(ar, b1, acc[2 * r + 1]);
    }
    a += mr;
    b += nr;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  if (m == mr && n == nr) {
#pragma GCC unroll 12
    for (int r = 0; r < mr; ++r) {
      put(c + r * ldc, acc[2 * r], va, vb, mode);
      put(c + r * ldc + 16, acc[2 * r + 1], va, vb, mode);
    }
    return;
  }
  // fringe: the same arithmetic on a stack copy of the valid part of C
  alignas(64) float t[mr * nr] = {};
  if (mode != 0)
    for (std::int64_t r = 0; r < m; ++r) std::memcpy(t + r * nr, c + r * ldc, static_cast<std::size_t>(n) * sizeof(float));
#pragma GCC unroll 12
  for (int r = 0; r < mr; ++r) {
    put(t + r * nr, acc[2 * r], va, vb, mode);
    put(t + r * nr + 16, acc[2 * r + 1], va, vb, mode);
  }
  for (std::int64_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, t + r * nr, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace headroom::host::sgemm::avx512

namespace headroom::host::sgemm {
struct Avx512 : FloatSlivers<avx512::mr, avx512::nr> {
  static constexpr std::int64_t mr = avx512::mr, nr = avx512::nr;
  static void tile(std::int64_t kb, const float* a, const float* b, float* c, std::int64_t ldc, std::int64_t m,
                   std::int64_t n, float alpha, float beta) {
    avx512::tile(kb, a, b, c, ldc, m, n, alpha, beta);
  }
};
}  // namespace headroom::host::sgemm
HEADROOM_TARGET_END
#endif  // HEADROOM_X86_KERNELS
