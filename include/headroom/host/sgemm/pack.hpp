#pragma once
// The float GEMM's driver, shared by its x86 kernels (sgemm/avx2.hpp,
// sgemm/avx512.hpp): Goto's loops around a register tile of Kernel::mr rows
// by Kernel::nr columns of C.
//
//   jc (nc columns of C) -> pc (kc of K) -> pack the (kc, nc) block of op(B)
//   into nr-wide slivers -> ic (mc rows of C) -> pack the (mc, kc) block of
//   op(A) into mr-high slivers -> jr -> ir -> Kernel::tile
//
// The packing absorbs the transpositions; fringe slivers are zero-padded,
// fringe tiles go through a stack tile. A sliver of B (nr kc floats) stays in
// L1 while the A block (mc kc) is read from L2, tile after tile. Each element
// of C sums k in one fixed order (chunks of kc, each in increasing k, one FMA
// per k, then alpha acc (+ beta C) per chunk), whatever the tile shape or the
// block it falls in: every kernel gives the same bits, and results do not
// depend on the worker count (unless a panel too small for full kc chunks
// makes blocks() cut kc; see there).
//
// Compiled for AVX2 + FMA (host/target.hpp); the AVX-512 kernel's tile is
// called from here.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../../core/workspace.hpp"
#include "../bf16.hpp"
#include "../f16.hpp"
#include "../target.hpp"

namespace headroom::host::detail {
[[noreturn]] inline void gemm_panels_too_small(std::int64_t need, std::int64_t have) {
  std::fprintf(stderr,
               "headroom: a GEMM needs %lld panel elements per worker but the plan reserved %lld "
               "(an op ran a product it did not declare with Builder::gemm)\n",
               static_cast<long long>(need), static_cast<long long>(have));
  std::abort();
}
}  // namespace headroom::host::detail

#if HEADROOM_X86_KERNELS
HEADROOM_TARGET_AVX2_BEGIN
namespace headroom::host::sgemm {

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

// The first `count` lanes of a store (count in 1..8).
inline __m256i lanes8(int count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), index);
}

// op(A) rows [0, mb) x k [0, kb) -> slivers of mr rows: sliver q holds, for
// each k, the mr values of rows q mr .. q mr + mr - 1 (zeros past mb).
// a_trans: op(A)(i, k) = A[k lda + i], else A[i lda + k].
template <std::int64_t mr, bool a_trans>
void pack_a(std::int64_t mb, std::int64_t kb, const float* A, std::int64_t lda, float* dst) {
  const std::int64_t full = mb / mr;
  if constexpr (a_trans) {
    // each k is a contiguous row of A: mr floats per sliver, taken 8 rows at
    // a time across all slivers (the rows stay in L1)
    for (std::int64_t k = 0; k < kb; k += 8) {
      const std::int64_t ke = kb - k < 8 ? kb - k : 8;
      for (std::int64_t q = 0; q < full; ++q) {
        const float* s = A + k * lda + q * mr;
        float* d = dst + q * mr * kb + k * mr;
        for (std::int64_t u = 0; u < ke; ++u) std::memcpy(d + u * mr, s + u * lda, mr * sizeof(float));
      }
    }
  } else {
    // 8 k of up to 8 rows at a time, transposed in registers; each of the 8
    // columns stores its rows' values at its k
    for (std::int64_t q = 0; q < full; ++q) {
      for (std::int64_t g = 0; g < mr; g += 8) {
        const int rows = static_cast<int>(mr - g < 8 ? mr - g : 8);
        const __m256i mask = lanes8(rows);
        const float* a = A + (q * mr + g) * lda;
        float* d = dst + q * mr * kb + g;
        std::int64_t k = 0;
        for (; k + 8 <= kb; k += 8) {
          __m256 r[8];
          for (int u = 0; u < 8; ++u) r[u] = u < rows ? _mm256_loadu_ps(a + u * lda + k) : _mm256_setzero_ps();
          transpose8(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
          for (int u = 0; u < 8; ++u) _mm256_maskstore_ps(d + (k + u) * mr, mask, r[u]);
        }
        for (; k < kb; ++k)
          for (int u = 0; u < rows; ++u) d[k * mr + u] = a[u * lda + k];
      }
    }
  }
  const std::int64_t i0 = full * mr;
  pack_fringe(kb, mr, mb - i0, dst + full * mr * kb,
              [&](std::int64_t k, std::int64_t r) { return a_trans ? A[k * lda + i0 + r] : A[(i0 + r) * lda + k]; });
}

// op(B) k [0, kb) x columns [0, nb) -> slivers of nr columns: sliver q holds,
// for each k, the nr values of columns q nr .. q nr + nr - 1 (zeros past nb).
// b_trans: op(B)(k, j) = B[j ldb + k], else B[k ldb + j].
template <std::int64_t nr, bool b_trans>
void pack_b(std::int64_t kb, std::int64_t nb, const float* B, std::int64_t ldb, float* dst) {
  static_assert(nr % 8 == 0);
  const std::int64_t full = nb / nr;
  if constexpr (b_trans) {
    // 8 columns (rows of B) x 8 k at a time, transposed in registers
    for (std::int64_t q = 0; q < full; ++q) {
      for (std::int64_t h = 0; h < nr / 8; ++h) {
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
    // each k is a contiguous row of B: nr floats per sliver, taken 8 rows at
    // a time across all slivers
    for (std::int64_t k = 0; k < kb; k += 8) {
      const std::int64_t ke = kb - k < 8 ? kb - k : 8;
      for (std::int64_t q = 0; q < full; ++q) {
        const float* b = B + k * ldb + q * nr;
        float* d = dst + q * nr * kb + k * nr;
        for (std::int64_t u = 0; u < ke; ++u)
          for (std::int64_t h = 0; h < nr; h += 8) _mm256_storeu_ps(d + u * nr + h, _mm256_loadu_ps(b + u * ldb + h));
      }
    }
  }
  const std::int64_t j0 = full * nr;
  pack_fringe(kb, nr, nb - j0, dst + full * nr * kb,
              [&](std::int64_t k, std::int64_t c) { return b_trans ? B[(j0 + c) * ldb + k] : B[k * ldb + j0 + c]; });
}

// The block sizes for an (M, N, K) block within `panel` elements: GemmBlocking's
// kc, mc (rounded down to mr) and nc (to nr), cut to the product, and cut
// further where the zero padding of fringe slivers would overflow the panel
// (small products only; the declared-size check has already passed).
struct Blocks {
  std::int64_t kc, mc, nc;
};
template <std::int64_t mr, std::int64_t nr>
Blocks blocks(std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t panel) {
  using G = GemmBlocking;
  static_assert(G::mc >= mr && G::nc >= nr && G::kc >= 1);
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
  if (b.kc < 1) detail::gemm_panels_too_small(G::align + mr + nr, panel);
  return b;
}

// op(A) / op(B) of 16-bit values (bf16 or f16), widened to float while
// packing, into the float kernels' slivers (the layouts above): a CPU without
// AVX512_BF16 runs a bf16 product on its float tile, and every CPU an f16 one.
template <class H>
inline constexpr bool sixteen_bit = std::is_same_v<H, bf16> || std::is_same_v<H, f16>;
template <std::int64_t mr, bool a_trans, class H>
  requires sixteen_bit<H>
void pack_a(std::int64_t mb, std::int64_t kb, const H* A, std::int64_t lda, float* dst) {
  for (std::int64_t q = 0; q * mr < mb; ++q)
    for (std::int64_t k = 0; k < kb; ++k)
      for (std::int64_t r = 0; r < mr; ++r) {
        const std::int64_t i = q * mr + r;
        dst[(q * kb + k) * mr + r] = i < mb ? to_float(a_trans ? A[k * lda + i] : A[i * lda + k]) : 0.0f;
      }
}
template <std::int64_t nr, bool b_trans, class H>
  requires sixteen_bit<H>
void pack_b(std::int64_t kb, std::int64_t nb, const H* B, std::int64_t ldb, float* dst) {
  for (std::int64_t q = 0; q * nr < nb; ++q)
    for (std::int64_t k = 0; k < kb; ++k)
      for (std::int64_t c = 0; c < nr; ++c) {
        const std::int64_t j = q * nr + c;
        dst[(q * kb + k) * nr + c] = j < nb ? to_float(b_trans ? B[j * ldb + k] : B[k * ldb + j]) : 0.0f;
      }
}

// A float tile's packing: its slivers hold one float per k.
template <std::int64_t mr, std::int64_t nr>
struct FloatSlivers {
  static std::int64_t k_words(std::int64_t kb) { return kb; }
  template <bool a_trans, class In>
  static void pack_a(std::int64_t mb, std::int64_t kb, const In* A, std::int64_t lda, float* dst) {
    sgemm::pack_a<mr, a_trans>(mb, kb, A, lda, dst);
  }
  template <bool b_trans, class In>
  static void pack_b(std::int64_t kb, std::int64_t nb, const In* B, std::int64_t ldb, float* dst) {
    sgemm::pack_b<nr, b_trans>(kb, nb, B, ldb, dst);
  }
};

// The blocks for a bf16 C, and `rows`: how many rows of C its float
// accumulator (rows, nc) holds at a time. All of M where that leaves nc at
// least 8 slivers wide (then op(B) is packed once per (kc, nc) block, as for
// a float C), else fewer rows; then, where the panel is small, blocks()
// cut further (first nc, then the rows and mc, then kc). The panel
// GemmBlocking::panel_elements declares for a bf16 C always fits at kc = 1.
struct AccumulatorBlocks {
  Blocks b;
  std::int64_t rows;
};
template <std::int64_t mr, std::int64_t nr>
AccumulatorBlocks blocks_with_accumulator(std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t panel) {
  using G = GemmBlocking;
  const auto min = [](std::int64_t x, std::int64_t y) { return x < y ? x : y; };
  AccumulatorBlocks a{blocks<mr, nr>(M, N, K, panel), M};
  Blocks& b = a.b;
  const std::int64_t packed = G::round(b.kc * b.mc);
  const std::int64_t floor = min((N + nr - 1) / nr * nr, 8 * nr);  // the narrowest nc worth packing B once for
  const std::int64_t wide = panel > packed ? (panel - packed) / (b.kc + M) / nr * nr : 0;
  if (wide >= floor) {
    b.nc = min(b.nc, wide);
  } else {  // fewer rows at a time, each a whole number of mc blocks where possible
    b.nc = min(b.nc, floor);
    const std::int64_t fit = panel > packed + b.kc * b.nc ? (panel - packed - b.kc * b.nc) / b.nc : 0;
    a.rows = fit >= b.mc ? fit / b.mc * b.mc : min(M, b.mc);
  }
  const auto need = [&] { return G::round(b.kc * b.mc) + b.kc * b.nc + min(M, a.rows) * min(N, b.nc); };
  while (need() > panel && b.nc > nr) b.nc -= nr;
  while (need() > panel && a.rows > mr) {  // both stay multiples of mr
    const std::int64_t r = (min(a.rows, b.mc) - 1) / mr * mr;
    a.rows = r > mr ? r : mr;
    b.mc = min(b.mc, a.rows);
  }
  while (need() > panel && b.kc > 1) b.kc = (b.kc + 1) / 2;
  if (need() > panel) detail::gemm_panels_too_small(need(), panel);
  return a;
}

// C (M, N) = alpha op(A) op(B) + beta C with Kernel's register tile; A and B
// hold In (float, or bf16 for Kernel's own packing or the widening above).
// A sliver holds Kernel::k_words(kb) words per row or column (kb floats, or
// kb / 2 bf16 pairs), never more than kb: the blocks fit the same panels.
template <class Kernel, bool a_trans, bool b_trans, class In>
void block(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const In* A, std::int64_t lda, const In* B,
           std::int64_t ldb, float beta, float* C, std::int64_t ldc, float* panels, std::int64_t panel_elements) {
  constexpr std::int64_t mr = Kernel::mr, nr = Kernel::nr;
  const Blocks bs = blocks<mr, nr>(M, N, K, panel_elements);
  float* pa = panels;
  float* pb = panels + GemmBlocking::round(bs.kc * bs.mc);
  for (std::int64_t jc = 0; jc < N; jc += bs.nc) {
    const std::int64_t nb = N - jc < bs.nc ? N - jc : bs.nc;
    for (std::int64_t pc = 0; pc < K; pc += bs.kc) {
      const std::int64_t kb = K - pc < bs.kc ? K - pc : bs.kc, kw = Kernel::k_words(kb);
      Kernel::template pack_b<b_trans>(kb, nb, b_trans ? B + jc * ldb + pc : B + pc * ldb + jc, ldb, pb);
      const float be = pc == 0 ? beta : 1.0f;
      for (std::int64_t ic = 0; ic < M; ic += bs.mc) {
        const std::int64_t mb = M - ic < bs.mc ? M - ic : bs.mc;
        Kernel::template pack_a<a_trans>(mb, kb, a_trans ? A + pc * lda + ic : A + ic * lda + pc, lda, pa);
        for (std::int64_t jr = 0; jr < nb; jr += nr) {
          const float* b = pb + jr * kw;
          const std::int64_t n = nb - jr < nr ? nb - jr : nr;
          for (std::int64_t ir = 0; ir < mb; ir += mr) {
            const std::int64_t m = mb - ir < mr ? mb - ir : mr;
            Kernel::tile(kw, pa + ir * kw, b, C + (ic + ir) * ldc + jc + jr, ldc, m, n, alpha, be);
          }
        }
      }
    }
  }
}

// A 16-bit C (bf16 or f16): the float block above, run on a float
// accumulator at the end of the panel, `rows` rows of C by nc columns at a
// time (usually every row: then op(B) is packed once per block, as for a
// float C), every chunk of K in the same order as for a float C, then
// rounded once: each element is the float product's, rounded to H.
template <class Kernel, bool a_trans, bool b_trans, class In, class H>
  requires sixteen_bit<H>
void block(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const In* A, std::int64_t lda, const In* B,
           std::int64_t ldb, float beta, H* C, std::int64_t ldc, float* panels, std::int64_t panel_elements) {
  const AccumulatorBlocks ab = blocks_with_accumulator<Kernel::mr, Kernel::nr>(M, N, K, panel_elements);
  for (std::int64_t i0 = 0; i0 < M; i0 += ab.rows) {
    const std::int64_t rows = M - i0 < ab.rows ? M - i0 : ab.rows;
    for (std::int64_t jc = 0; jc < N; jc += ab.b.nc) {
      const std::int64_t nb = N - jc < ab.b.nc ? N - jc : ab.b.nc;
      float* acc = panels + panel_elements - rows * nb;  // (rows, nb), after the packed blocks
      H* c = C + i0 * ldc + jc;
      if (beta != 0.0f)
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = 0; j < nb; ++j) acc[i * nb + j] = to_float(c[i * ldc + j]);
      block<Kernel, a_trans, b_trans>(rows, nb, K, alpha, a_trans ? A + i0 : A + i0 * lda, lda, b_trans ? B + jc * ldb : B + jc,
                                      ldb, beta, acc, nb, panels, panel_elements - rows * nb);
      for (std::int64_t i = 0; i < rows; ++i) narrow_row(acc + i * nb, c + i * ldc, nb);
    }
  }
}

}  // namespace headroom::host::sgemm
HEADROOM_TARGET_END
#endif  // HEADROOM_X86_KERNELS
