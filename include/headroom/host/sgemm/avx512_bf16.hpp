#pragma once
// The bf16 GEMM's AVX512_BF16 register tile: 12 rows x 32 columns of C in 24
// zmm float accumulators, run by sgemm/pack.hpp's driver on bf16 operands.
// Its slivers hold k in pairs: one 32-bit word per row (A) or column (B) and
// pair of k, (k even in the low half, k + 1 in the high; a zero past an odd
// kb). Per pair: two loads of B, twelve broadcasts of A, 24 vdpbf16ps, each
// adding two products per lane (products of bf16 values are exact in float;
// the instruction adds them to the accumulator with round-to-nearest and
// denormals treated as zero). So a pair's two products are added in the
// instruction's order, not one FMA at a time as the float tiles do: the bits
// differ from the widening path's, within float rounding.
#include <cstdint>
#include <cstring>

#include "../bf16.hpp"
#include "../target.hpp"
#include "avx512.hpp"
#include "pack.hpp"

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX512_BF16_BEGIN
namespace headroom::host::sgemm::avx512_bf16 {

constexpr std::int64_t mr = 12, nr = 32;

// The word of k pair p of a row read at stride 1 in k: (x[2p], x[2p + 1]).
inline std::uint32_t pair_along(const bf16* x, std::int64_t p, std::int64_t kb) {
  const std::uint32_t lo = x[2 * p].bits, hi = 2 * p + 1 < kb ? x[2 * p + 1].bits : 0u;
  return lo | hi << 16;
}
// The word of k pair p of a column read at stride ld in k.
inline std::uint32_t pair_across(const bf16* x, std::int64_t ld, std::int64_t p, std::int64_t kb) {
  const std::uint32_t lo = x[2 * p * ld].bits, hi = 2 * p + 1 < kb ? x[(2 * p + 1) * ld].bits : 0u;
  return lo | hi << 16;
}

// 16 pair words from two rows of bf16 values: (lo[c], hi[c]) for c in [0, 16)
inline __m512i interleave16(const bf16* lo, const bf16* hi) {
  const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)));
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

// op(A) rows [0, mb) x k [0, kb) -> slivers of mr rows x kp pairs (zeros past mb)
template <bool a_trans>
void pack_a(std::int64_t mb, std::int64_t kb, const bf16* A, std::int64_t lda, std::uint32_t* dst) {
  const std::int64_t kp = (kb + 1) / 2, full = mb / mr, whole = kb / 2;  // whole: pairs with both halves
  if constexpr (!a_trans) {
    // a row's pairs are adjacent 32-bit words: the float packing's transpose
    // of words does it (bit patterns are moved, never computed on)
    if (lda % 2 == 0 && kb % 2 == 0 && reinterpret_cast<std::uintptr_t>(A) % 4 == 0) {
      sgemm::pack_a<mr, false>(full * mr, whole, reinterpret_cast<const float*>(A), lda / 2, reinterpret_cast<float*>(dst));
    } else {
      for (std::int64_t q = 0; q < full; ++q)
        for (std::int64_t r = 0; r < mr; ++r)
          for (std::int64_t p = 0; p < kp; ++p) dst[q * mr * kp + p * mr + r] = pair_along(A + (q * mr + r) * lda, p, kb);
    }
  } else {
    // op(A)(i, k) = A[k lda + i]: rows 2p and 2p + 1 of A, 12 values each, interleaved
    const __mmask16 twelve = 0x0fff;
    for (std::int64_t q = 0; q < full; ++q) {
      std::uint32_t* d = dst + q * mr * kp;
      for (std::int64_t p = 0; p < whole; ++p) {
        const bf16* lo = A + 2 * p * lda + q * mr;
        const __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(twelve, lo));
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(twelve, lo + lda));
        _mm512_mask_storeu_epi32(d + p * mr, twelve, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
      }
      for (std::int64_t p = whole; p < kp; ++p)
        for (std::int64_t r = 0; r < mr; ++r) d[p * mr + r] = pair_across(A + q * mr + r, lda, p, kb);
    }
  }
  if (full * mr < mb) {  // the last, partial sliver: zeros past mb
    std::uint32_t* d = dst + full * mr * kp;
    for (std::int64_t r = 0; r < mr; ++r) {
      const std::int64_t i = full * mr + r;
      for (std::int64_t p = 0; p < kp; ++p)
        d[p * mr + r] = i >= mb ? 0u : a_trans ? pair_across(A + i, lda, p, kb) : pair_along(A + i * lda, p, kb);
    }
  }
}

// op(B) k [0, kb) x columns [0, nb) -> slivers of nr columns x kp pairs (zeros past nb)
template <bool b_trans>
void pack_b(std::int64_t kb, std::int64_t nb, const bf16* B, std::int64_t ldb, std::uint32_t* dst) {
  const std::int64_t kp = (kb + 1) / 2, full = nb / nr, whole = kb / 2;
  if constexpr (b_trans) {
    // op(B)(k, j) = B[j ldb + k]: a column's pairs are adjacent words, as above
    if (ldb % 2 == 0 && kb % 2 == 0 && reinterpret_cast<std::uintptr_t>(B) % 4 == 0) {
      sgemm::pack_b<nr, true>(whole, full * nr, reinterpret_cast<const float*>(B), ldb / 2, reinterpret_cast<float*>(dst));
    } else {
      for (std::int64_t q = 0; q < full; ++q)
        for (std::int64_t p = 0; p < kp; ++p)
          for (std::int64_t c = 0; c < nr; ++c) dst[q * nr * kp + p * nr + c] = pair_along(B + (q * nr + c) * ldb, p, kb);
    }
  } else {
    // rows 2p and 2p + 1 of B, 32 values each, interleaved
    for (std::int64_t q = 0; q < full; ++q) {
      std::uint32_t* d = dst + q * nr * kp;
      for (std::int64_t p = 0; p < whole; ++p) {
        const bf16* lo = B + 2 * p * ldb + q * nr;
        _mm512_storeu_si512(d + p * nr, interleave16(lo, lo + ldb));
        _mm512_storeu_si512(d + p * nr + 16, interleave16(lo + 16, lo + ldb + 16));
      }
      for (std::int64_t p = whole; p < kp; ++p)
        for (std::int64_t c = 0; c < nr; ++c) d[p * nr + c] = pair_across(B + q * nr + c, ldb, p, kb);
    }
  }
  if (full * nr < nb) {  // the last, partial sliver: zeros past nb
    std::uint32_t* d = dst + full * nr * kp;
    for (std::int64_t p = 0; p < kp; ++p)
      for (std::int64_t c = 0; c < nr; ++c) {
        const std::int64_t j = full * nr + c;
        d[p * nr + c] = j >= nb ? 0u : b_trans ? pair_along(B + j * ldb, p, kb) : pair_across(B + j, ldb, p, kb);
      }
  }
}

// C (m x n, m <= 12, n <= 32) = alpha a b + beta C for one sliver of A
// (kp pairs x 12) and one of B (kp pairs x 32).
inline void tile(std::int64_t kp, const std::uint32_t* __restrict a, const std::uint32_t* __restrict b, float* c,
                 std::int64_t ldc, std::int64_t m, std::int64_t n, float alpha, float beta) {
  __m512 acc[2 * mr];
#pragma GCC unroll 24
  for (int i = 0; i < 2 * mr; ++i) acc[i] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < mr; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], ar, b0);
      acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], ar, b1);
    }
    a += mr;
    b += nr;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  if (m == mr && n == nr) {
#pragma GCC unroll 12
    for (int r = 0; r < mr; ++r) {
      avx512::put(c + r * ldc, acc[2 * r], va, vb, mode);
      avx512::put(c + r * ldc + 16, acc[2 * r + 1], va, vb, mode);
    }
    return;
  }
  alignas(64) float t[mr * nr] = {};
  if (mode != 0)
    for (std::int64_t r = 0; r < m; ++r) std::memcpy(t + r * nr, c + r * ldc, static_cast<std::size_t>(n) * sizeof(float));
#pragma GCC unroll 12
  for (int r = 0; r < mr; ++r) {
    avx512::put(t + r * nr, acc[2 * r], va, vb, mode);
    avx512::put(t + r * nr + 16, acc[2 * r + 1], va, vb, mode);
  }
  for (std::int64_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, t + r * nr, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace headroom::host::sgemm::avx512_bf16

namespace headroom::host::sgemm {
// The driver's view: panels are float-sized words, a sliver holds kb / 2
// (rounded up) pair words per row or column.
struct Avx512Bf16 {
  static constexpr std::int64_t mr = avx512_bf16::mr, nr = avx512_bf16::nr;
  static std::int64_t k_words(std::int64_t kb) { return (kb + 1) / 2; }
  template <bool a_trans>
  static void pack_a(std::int64_t mb, std::int64_t kb, const bf16* A, std::int64_t lda, float* dst) {
    avx512_bf16::pack_a<a_trans>(mb, kb, A, lda, reinterpret_cast<std::uint32_t*>(dst));
  }
  template <bool b_trans>
  static void pack_b(std::int64_t kb, std::int64_t nb, const bf16* B, std::int64_t ldb, float* dst) {
    avx512_bf16::pack_b<b_trans>(kb, nb, B, ldb, reinterpret_cast<std::uint32_t*>(dst));
  }
  static void tile(std::int64_t kp, const float* a, const float* b, float* c, std::int64_t ldc, std::int64_t m,
                   std::int64_t n, float alpha, float beta) {
    avx512_bf16::tile(kp, reinterpret_cast<const std::uint32_t*>(a), reinterpret_cast<const std::uint32_t*>(b), c, ldc,
                      m, n, alpha, beta);
  }
};
}  // namespace headroom::host::sgemm
HEADROOM_TARGET_END
#endif  // HEADROOM_X86_KERNELS
