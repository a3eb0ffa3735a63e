#pragma once
// GEMM on the host, packed (Goto's algorithm) with packing panels taken from
// the plan's arena, so a product allocates nothing.
//
//   C (M, N) = alpha * op(A) op(B) + beta * C        all row-major
//   op(A) is (M, K): A itself (lda >= K), or A^T of an (K, M) A (lda >= M)
//   op(B) is (K, N): B itself (ldb >= N), or B^T of an (N, K) B (ldb >= K)
//
// float on x86-64 with AVX2 + FMA (g++ or clang) runs headroom's own kernel
// (sgemm below: 6 x 16 register tiles); double, and builds without AVX2/FMA
// (or with HEADROOM_GEMM_NO_AVX2 defined), run Eigen's sequential gebp kernel.
//
// The work is split over workers by rows of C (or columns, when C is wider
// than tall); each worker runs the sequential kernel on its block with its
// own panels (GemmBlocking in plan/graph.hpp sizes them; the plan holds them
// as the "gemm panels" workspace). Each element of C is computed by one
// worker, in one order: results depend only on the worker count.
#include <Eigen/Core>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__x86_64__) && defined(__GNUC__) && \
    !defined(HEADROOM_GEMM_NO_AVX2)
#define HEADROOM_GEMM_AVX2 1
#include <immintrin.h>
#endif

#include "../plan/graph.hpp"
#include "panels.hpp"
#include "parallel.hpp"

namespace headroom::host {

namespace detail {

// Eigen's blocking descriptor, pointed at our panels instead of its heap.
template <class T>
class ArenaBlocking : public Eigen::internal::level3_blocking<T, T> {
 public:
  ArenaBlocking(T* a, T* b, Eigen::Index mc, Eigen::Index nc, Eigen::Index kc) {
    this->m_blockA = a;
    this->m_blockB = b;
    this->m_mc = mc;
    this->m_nc = nc;
    this->m_kc = kc;
  }
};

[[noreturn]] inline void gemm_panels_too_small(std::int64_t need, std::int64_t have) {
  std::fprintf(stderr,
               "headroom: a GEMM needs %lld panel elements per worker but the plan reserved %lld "
               "(an op ran a product it did not declare with Builder::gemm)\n",
               static_cast<long long>(need), static_cast<long long>(have));
  std::abort();
}

#if HEADROOM_GEMM_AVX2
// ---------------------------------------------------------------------------
// float, AVX2 + FMA: loops jc (nc columns of C) -> pc (kc of K) -> pack the
// (kc, nc) block of op(B) into 16-wide slivers -> ic (mc rows of C) -> pack
// the (mc, kc) block of op(A) into 6-high slivers -> jr -> ir -> a 6 x 16
// register tile (12 accumulators). The packing absorbs the transpositions;
// fringe slivers are zero-padded, fringe tiles go through a stack tile. A
// sliver of B (16 kc floats) stays in L1 while the A block (mc kc) is read
// from L2, tile after tile. Each element of C sums k in one fixed order
// (chunks of kc, each in increasing k), whatever the block it falls in, so
// the float results do not even depend on the worker count (unless a panel
// too small for full kc chunks makes blocks() cut kc; see there).
namespace sgemm {

constexpr std::int64_t mr = 6, nr = 16;
static_assert(GemmBlocking::mc >= mr && GemmBlocking::nc >= nr && GemmBlocking::kc >= 1);

inline void transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5, __m256& r6,
                       __m256& r7) {
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r0 = _mm256_permute2f128_ps(s0, s4, 0x20);
  r1 = _mm256_permute2f128_ps(s1, s5, 0x20);
  r2 = _mm256_permute2f128_ps(s2, s6, 0x20);
  r3 = _mm256_permute2f128_ps(s3, s7, 0x20);
  r4 = _mm256_permute2f128_ps(s0, s4, 0x31);
  r5 = _mm256_permute2f128_ps(s1, s5, 0x31);
  r6 = _mm256_permute2f128_ps(s2, s6, 0x31);
  r7 = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// The last, partial sliver of a packed block: `rest` of `width` values per k
// from at(k, c), zero-padded (rest <= 0: nothing to pack).
template <class At>
void pack_fringe(std::int64_t kb, std::int64_t width, std::int64_t rest, float* d, At at) {
  if (rest <= 0) return;
  for (std::int64_t k = 0; k < kb; ++k)
    for (std::int64_t c = 0; c < width; ++c) d[k * width + c] = c < rest ? at(k, c) : 0.0f;
}

// op(A) rows [0, mb) x k [0, kb) -> slivers of mr rows: sliver q holds, for
// each k, the mr values of rows q mr .. q mr + mr - 1 (zeros past mb).
// a_trans: op(A)(i, k) = A[k lda + i], else A[i lda + k].
template <bool a_trans>
void pack_a(std::int64_t mb, std::int64_t kb, const float* A, std::int64_t lda, float* dst) {
  const std::int64_t full = mb / mr;
  if constexpr (a_trans) {
    // each k is a contiguous row of A: 6 floats per sliver, taken 8 rows at
    // a time across all slivers (the rows stay in L1, each sliver is written
    // 48 floats at a time)
    for (std::int64_t k = 0; k < kb; k += 8) {
      const std::int64_t ke = kb - k < 8 ? kb - k : 8;
      for (std::int64_t q = 0; q < full; ++q) {
        const float* s = A + k * lda + q * mr;
        float* d = dst + q * mr * kb + k * mr;
        for (std::int64_t u = 0; u < ke; ++u) std::memcpy(d + u * mr, s + u * lda, mr * sizeof(float));
      }
    }
  } else {
    const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for (std::int64_t q = 0; q < full; ++q) {
      const float* a = A + q * mr * lda;
      float* d = dst + q * mr * kb;
      std::int64_t k = 0;
      for (; k + 8 <= kb; k += 8) {
        __m256 r0 = _mm256_loadu_ps(a + k), r1 = _mm256_loadu_ps(a + lda + k);
        __m256 r2 = _mm256_loadu_ps(a + 2 * lda + k), r3 = _mm256_loadu_ps(a + 3 * lda + k);
        __m256 r4 = _mm256_loadu_ps(a + 4 * lda + k), r5 = _mm256_loadu_ps(a + 5 * lda + k);
        __m256 r6 = _mm256_setzero_ps(), r7 = _mm256_setzero_ps();
        transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
        // 8 columns of 6: each store's two spare lanes are overwritten by the next
        float* o = d + k * mr;
        _mm256_storeu_ps(o, r0);
        _mm256_storeu_ps(o + 6, r1);
        _mm256_storeu_ps(o + 12, r2);
        _mm256_storeu_ps(o + 18, r3);
        _mm256_storeu_ps(o + 24, r4);
        _mm256_storeu_ps(o + 30, r5);
        _mm256_storeu_ps(o + 36, r6);
        _mm256_maskstore_ps(o + 42, six, r7);
      }
      for (; k < kb; ++k)
        for (std::int64_t r = 0; r < mr; ++r) d[k * mr + r] = a[r * lda + k];
    }
  }
  const std::int64_t i0 = full * mr;
  pack_fringe(kb, mr, mb - i0, dst + full * mr * kb,
              [&](std::int64_t k, std::int64_t r) { return a_trans ? A[k * lda + i0 + r] : A[(i0 + r) * lda + k]; });
}

// op(B) k [0, kb) x columns [0, nb) -> slivers of nr columns: sliver q holds,
// for each k, the nr values of columns q nr .. q nr + nr - 1 (zeros past nb).
// b_trans: op(B)(k, j) = B[j ldb + k], else B[k ldb + j].
template <bool b_trans>
void pack_b(std::int64_t kb, std::int64_t nb, const float* B, std::int64_t ldb, float* dst) {
  const std::int64_t full = nb / nr;
  if constexpr (b_trans) {
    // 8 columns (rows of B) x 8 k at a time, transposed in registers
    for (std::int64_t q = 0; q < full; ++q) {
      for (int h = 0; h < 2; ++h) {
        const float* b = B + (q * nr + 8 * h) * ldb;
        float* o = dst + q * nr * kb + 8 * h;
        std::int64_t k = 0;
        for (; k + 8 <= kb; k += 8) {
          __m256 r0 = _mm256_loadu_ps(b + k), r1 = _mm256_loadu_ps(b + ldb + k);
          __m256 r2 = _mm256_loadu_ps(b + 2 * ldb + k), r3 = _mm256_loadu_ps(b + 3 * ldb + k);
          __m256 r4 = _mm256_loadu_ps(b + 4 * ldb + k), r5 = _mm256_loadu_ps(b + 5 * ldb + k);
          __m256 r6 = _mm256_loadu_ps(b + 6 * ldb + k), r7 = _mm256_loadu_ps(b + 7 * ldb + k);
          transpose8(r0, r1, r2, r3, r4, r5, r6, r7);
          float* p = o + k * nr;
          _mm256_storeu_ps(p, r0);
          _mm256_storeu_ps(p + nr, r1);
          _mm256_storeu_ps(p + 2 * nr, r2);
          _mm256_storeu_ps(p + 3 * nr, r3);
          _mm256_storeu_ps(p + 4 * nr, r4);
          _mm256_storeu_ps(p + 5 * nr, r5);
          _mm256_storeu_ps(p + 6 * nr, r6);
          _mm256_storeu_ps(p + 7 * nr, r7);
        }
        for (; k < kb; ++k)
          for (std::int64_t c = 0; c < 8; ++c) o[k * nr + c] = b[c * ldb + k];
      }
    }
  } else {
    // each k is a contiguous row of B: 16 floats per sliver, taken 8 rows at
    // a time across all slivers
    for (std::int64_t k = 0; k < kb; k += 8) {
      const std::int64_t ke = kb - k < 8 ? kb - k : 8;
      for (std::int64_t q = 0; q < full; ++q) {
        const float* b = B + k * ldb + q * nr;
        float* d = dst + q * nr * kb + k * nr;
        for (std::int64_t u = 0; u < ke; ++u) {
          _mm256_storeu_ps(d + u * nr, _mm256_loadu_ps(b + u * ldb));
          _mm256_storeu_ps(d + u * nr + 8, _mm256_loadu_ps(b + u * ldb + 8));
        }
      }
    }
  }
  const std::int64_t j0 = full * nr;
  pack_fringe(kb, nr, nb - j0, dst + full * nr * kb,
              [&](std::int64_t k, std::int64_t c) { return b_trans ? B[(j0 + c) * ldb + k] : B[k * ldb + j0 + c]; });
}

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

// The block sizes for an (M, N, K) block within `panel` elements: GemmBlocking's
// kc, mc (rounded down to mr) and nc (to nr), cut to the product, and cut
// further where the zero padding of fringe slivers would overflow the panel
// (small products only; the declared-size check has already passed).
struct Blocks {
  std::int64_t kc, mc, nc;
};
inline Blocks blocks(std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t panel) {
  using G = GemmBlocking;
  const auto up = [](std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; };
  const auto min = [](std::int64_t x, std::int64_t y) { return x < y ? x : y; };
  Blocks b{min(K, G::kc), min(up(M, mr), G::mc / mr * mr), min(up(N, nr), G::nc / nr * nr)};
  const auto fits = [&] { return G::round(b.kc * b.mc) + b.kc * b.nc <= panel; };
  if (fits()) return b;
  if (panel - G::round(b.kc * b.mc) >= nr * b.kc) {
    b.nc = (panel - G::round(b.kc * b.mc)) / b.kc / nr * nr;
    return b;
  }
  b.nc = nr;
  if (panel - nr * b.kc - (G::align - 1) >= mr * b.kc) {
    b.mc = (panel - nr * b.kc - (G::align - 1)) / b.kc / mr * mr;
    return b;
  }
  b.mc = mr;
  b.kc = (panel - (G::align - 1)) / (mr + nr);
  if (b.kc < 1) gemm_panels_too_small(G::align + mr + nr, panel);
  return b;
}

template <bool a_trans, bool b_trans>
void block(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t lda,
           const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, float* panels,
           std::int64_t panel_elements) {
  const Blocks bs = blocks(M, N, K, panel_elements);
  float* pa = panels;
  float* pb = panels + GemmBlocking::round(bs.kc * bs.mc);
  for (std::int64_t jc = 0; jc < N; jc += bs.nc) {
    const std::int64_t nb = N - jc < bs.nc ? N - jc : bs.nc;
    for (std::int64_t pc = 0; pc < K; pc += bs.kc) {
      const std::int64_t kb = K - pc < bs.kc ? K - pc : bs.kc;
      pack_b<b_trans>(kb, nb, b_trans ? B + jc * ldb + pc : B + pc * ldb + jc, ldb, pb);
      const float be = pc == 0 ? beta : 1.0f;
      for (std::int64_t ic = 0; ic < M; ic += bs.mc) {
        const std::int64_t mb = M - ic < bs.mc ? M - ic : bs.mc;
        pack_a<a_trans>(mb, kb, a_trans ? A + pc * lda + ic : A + ic * lda + pc, lda, pa);
        for (std::int64_t jr = 0; jr < nb; jr += nr) {
          const float* b = pb + jr * kb;
          const std::int64_t n = nb - jr < nr ? nb - jr : nr;
          for (std::int64_t ir = 0; ir < mb; ir += mr) {
            const std::int64_t m = mb - ir < mr ? mb - ir : mr;
            tile(kb, pa + ir * kb, b, C + (ic + ir) * ldc + jc + jr, ldc, m, n, alpha, be);
          }
        }
      }
    }
  }
}

}  // namespace sgemm
#endif  // HEADROOM_GEMM_AVX2

// One worker's block, sequentially, with its panels.
template <class T, int LhsOrder, int RhsOrder>
void gemm_block(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B,
                std::int64_t ldb, T beta, T* C, std::int64_t ldc, T* panels, std::int64_t panel_elements) {
  if (M <= 0 || N <= 0) return;
  const auto scale_c = [&] {
    for (std::int64_t i = 0; i < M; ++i) {
      T* row = C + i * ldc;
      if (beta == T(0)) {
        for (std::int64_t j = 0; j < N; ++j) row[j] = T(0);
      } else if (beta != T(1)) {
        for (std::int64_t j = 0; j < N; ++j) row[j] *= beta;
      }
    }
  };
  if (K <= 0 || alpha == T(0)) return scale_c();
  // The panels the plan declared for this product: Eigen's blocking. Eigen
  // transposes a row-major product into a column-major one: its "rows" are
  // our N and its "cols" our M (see GeneralMatrixMatrix.h).
  using G = GemmBlocking;
  const std::int64_t kc = K < G::kc ? K : G::kc;
  const std::int64_t mc = N < G::mc ? N : G::mc;
  const std::int64_t nc = M < G::nc ? M : G::nc;
  const std::int64_t size_a = G::round(kc * mc), size_b = G::round(kc * nc);
  if (size_a + size_b > panel_elements) gemm_panels_too_small(size_a + size_b, panel_elements);
#if HEADROOM_GEMM_AVX2
  if constexpr (std::is_same_v<T, float>) {
    // beta is applied with the first chunk of K
    sgemm::block<LhsOrder != Eigen::RowMajor, RhsOrder != Eigen::RowMajor>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                                                            panels, panel_elements);
  } else
#endif
  {
    scale_c();
    ArenaBlocking<T> blocking(panels, panels + size_a, mc, nc, kc);
    Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, LhsOrder, false, T, RhsOrder, false,
                                                   Eigen::RowMajor, 1>::run(M, N, K, A, lda, B, ldb, C, 1, ldc, alpha,
                                                                            blocking, nullptr);
  }
}

template <class T, int LhsOrder, int RhsOrder>
void gemm_split(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B,
                std::int64_t ldb, T beta, T* C, std::int64_t ldc, const GemmPanels<T>& ws, int workers) {
  // element (i, k) of op(A) / (k, j) of op(B)
  const bool a_rows = LhsOrder == Eigen::RowMajor, b_rows = RhsOrder == Eigen::RowMajor;
  const bool by_rows = M >= N;
  team(workers, [&](int w, int count) {
    const Range r = share(by_rows ? M : N, count, w);
    if (r.size() <= 0) return;
    if (by_rows) {
      const T* a = a_rows ? A + r.begin * lda : A + r.begin;
      gemm_block<T, LhsOrder, RhsOrder>(r.size(), N, K, alpha, a, lda, B, ldb, beta, C + r.begin * ldc, ldc, ws.of(w),
                                        ws.per_worker);
    } else {
      const T* b = b_rows ? B + r.begin : B + r.begin * ldb;
      gemm_block<T, LhsOrder, RhsOrder>(M, r.size(), K, alpha, A, lda, b, ldb, beta, C + r.begin, ldc, ws.of(w),
                                        ws.per_worker);
    }
  });
}

}  // namespace detail

enum class Trans : bool { no = false, yes = true };

template <class T>
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
          const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc, const GemmPanels<T>& ws, int workers) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (ta == Trans::no && tb == Trans::no) detail::gemm_split<T, R, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else if (ta == Trans::no) detail::gemm_split<T, R, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else if (tb == Trans::no) detail::gemm_split<T, Cm, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else detail::gemm_split<T, Cm, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
}

// The same product on the calling thread only, with worker w's panels (for
// kernels that already run inside a team).
template <class T>
void gemm_serial(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
                 const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc, const GemmPanels<T>& ws, int w) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  T* p = ws.of(w);
  const std::int64_t n = ws.per_worker;
  if (ta == Trans::no && tb == Trans::no) detail::gemm_block<T, R, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else if (ta == Trans::no) detail::gemm_block<T, R, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else if (tb == Trans::no) detail::gemm_block<T, Cm, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else detail::gemm_block<T, Cm, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
}

}  // namespace headroom::host
