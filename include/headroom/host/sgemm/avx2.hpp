#pragma once
// The float GEMM's AVX2 + FMA register tile: 6 rows x 16 columns of C in 12
// ymm accumulators, run by sgemm/pack.hpp's driver.
#include <cstdint>
#include <cstring>

#include "../target.hpp"
#include "pack.hpp"

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
namespace headroom::host::sgemm::avx2 {

constexpr std::int64_t mr = 6, nr = 16;

// p[0..8) = alpha acc + beta p[0..8)   (beta 0: p is not read)
inline void put(float* p, __m256 acc, __m256 va, __m256 vb, int mode) {
  if (mode == 0) _mm256_storeu_ps(p, _mm256_mul_ps(va, acc));
  else if (mode == 1) _mm256_storeu_ps(p, _mm256_fmadd_ps(va, acc, _mm256_loadu_ps(p)));
  else _mm256_storeu_ps(p, _mm256_fmadd_ps(va, acc, _mm256_mul_ps(vb, _mm256_loadu_ps(p))));
}

// C (m x n, m <= 6, n <= 16) = alpha a b + beta C for one sliver of A (kb x 6)
// and one of B (kb x 16).
inline void tile(std::int64_t kb, const float* __restrict a, const float* __restrict b, float* c, std::int64_t ldc,
                 std::int64_t m, std::int64_t n, float alpha, float beta) {
  for (std::int64_t r = 0; r < m; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + nr - 1), _MM_HINT_T0);
  }
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
         c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
         c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
         c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  // The k loop in (GNU inline) assembly: g++ 12 compiles the same loop
  // written with intrinsics into one that reloads B from memory for most FMAs
  // and moves accumulators between registers, about 20 % slower (79 against
  // 101 GFLOP/s for this tile alone on an AVX2 EPYC). ymm12/13 hold the 16
  // floats of B at k, ymm14/15 alternate the broadcasts of A.
#define HEADROOM_SGEMM_STEP(u)                                                 \
  "vmovups " #u "*64(%[b]), %%ymm12\n\t"                                      \
  "vmovups " #u "*64+32(%[b]), %%ymm13\n\t"                                   \
  "vbroadcastss " #u "*24(%[a]), %%ymm14\n\t"                                 \
  "vbroadcastss " #u "*24+4(%[a]), %%ymm15\n\t"                               \
  "vfmadd231ps %%ymm12, %%ymm14, %[c00]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm14, %[c01]\n\t"                                  \
  "vbroadcastss " #u "*24+8(%[a]), %%ymm14\n\t"                               \
  "vfmadd231ps %%ymm12, %%ymm15, %[c10]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm15, %[c11]\n\t"                                  \
  "vbroadcastss " #u "*24+12(%[a]), %%ymm15\n\t"                              \
  "vfmadd231ps %%ymm12, %%ymm14, %[c20]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm14, %[c21]\n\t"                                  \
  "vbroadcastss " #u "*24+16(%[a]), %%ymm14\n\t"                              \
  "vfmadd231ps %%ymm12, %%ymm15, %[c30]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm15, %[c31]\n\t"                                  \
  "vbroadcastss " #u "*24+20(%[a]), %%ymm15\n\t"                              \
  "vfmadd231ps %%ymm12, %%ymm14, %[c40]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm14, %[c41]\n\t"                                  \
  "vfmadd231ps %%ymm12, %%ymm15, %[c50]\n\t"                                  \
  "vfmadd231ps %%ymm13, %%ymm15, %[c51]\n\t"
  std::int64_t k4 = kb / 4;
  if (k4 > 0) {
    __asm__ volatile(
        ".p2align 5\n\t"
        "1:\n\t"
        "prefetcht0 768(%[a])\n\t"
        HEADROOM_SGEMM_STEP(0)
        HEADROOM_SGEMM_STEP(1)
        HEADROOM_SGEMM_STEP(2)
        HEADROOM_SGEMM_STEP(3)
        "addq $96, %[a]\n\t"
        "addq $256, %[b]\n\t"
        "decq %[k]\n\t"
        "jnz 1b\n\t"
        : [a] "+r"(a), [b] "+r"(b), [k] "+r"(k4), [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10),
          [c11] "+x"(c11), [c20] "+x"(c20), [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31), [c40] "+x"(c40),
          [c41] "+x"(c41), [c50] "+x"(c50), [c51] "+x"(c51)
        :
        : "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc");
  }
  for (std::int64_t k = kb % 4; k > 0; --k) {
    __asm__ volatile(HEADROOM_SGEMM_STEP(0)
                     "addq $24, %[a]\n\t"
                     "addq $64, %[b]\n\t"
                     : [a] "+r"(a), [b] "+r"(b), [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11),
                       [c20] "+x"(c20), [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31), [c40] "+x"(c40),
                       [c41] "+x"(c41), [c50] "+x"(c50), [c51] "+x"(c51)
                     :
                     : "xmm12", "xmm13", "xmm14", "xmm15", "memory");
  }
#undef HEADROOM_SGEMM_STEP
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  if (m == mr && n == nr) {
    put(c, c00, va, vb, mode), put(c + 8, c01, va, vb, mode);
    put(c + ldc, c10, va, vb, mode), put(c + ldc + 8, c11, va, vb, mode);
    put(c + 2 * ldc, c20, va, vb, mode), put(c + 2 * ldc + 8, c21, va, vb, mode);
    put(c + 3 * ldc, c30, va, vb, mode), put(c + 3 * ldc + 8, c31, va, vb, mode);
    put(c + 4 * ldc, c40, va, vb, mode), put(c + 4 * ldc + 8, c41, va, vb, mode);
    put(c + 5 * ldc, c50, va, vb, mode), put(c + 5 * ldc + 8, c51, va, vb, mode);
    return;
  }
  // fringe: the same arithmetic on a stack copy of the valid part of C
  alignas(32) float t[mr * nr] = {};
  if (mode != 0)
    for (std::int64_t r = 0; r < m; ++r) std::memcpy(t + r * nr, c + r * ldc, static_cast<std::size_t>(n) * sizeof(float));
  put(t, c00, va, vb, mode), put(t + 8, c01, va, vb, mode);
  put(t + nr, c10, va, vb, mode), put(t + nr + 8, c11, va, vb, mode);
  put(t + 2 * nr, c20, va, vb, mode), put(t + 2 * nr + 8, c21, va, vb, mode);
  put(t + 3 * nr, c30, va, vb, mode), put(t + 3 * nr + 8, c31, va, vb, mode);
  put(t + 4 * nr, c40, va, vb, mode), put(t + 4 * nr + 8, c41, va, vb, mode);
  put(t + 5 * nr, c50, va, vb, mode), put(t + 5 * nr + 8, c51, va, vb, mode);
  for (std::int64_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, t + r * nr, static_cast<std::size_t>(n) * sizeof(float));
}

}  // namespace headroom::host::sgemm::avx2

namespace headroom::host::sgemm {
struct Avx2 : FloatSlivers<avx2::mr, avx2::nr> {
  static constexpr std::int64_t mr = avx2::mr, nr = avx2::nr;
  static void tile(std::int64_t kb, const float* a, const float* b, float* c, std::int64_t ldc, std::int64_t m,
                   std::int64_t n, float alpha, float beta) {
    avx2::tile(kb, a, b, c, ldc, m, n, alpha, beta);
  }
};
}  // namespace headroom::host::sgemm
HEADROOM_TARGET_END
#endif  // HEADROOM_X86_KERNELS
