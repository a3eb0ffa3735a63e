#pragma once
// GEMM on the host, packed (Goto's algorithm) with packing panels taken from
// the plan's arena, so a product allocates nothing.
//
//   C (M, N) = alpha * op(A) op(B) + beta * C        all row-major
//   op(A) is (M, K): A itself (lda >= K), or A^T of an (K, M) A (lda >= M)
//   op(B) is (K, N): B itself (ldb >= N), or B^T of an (N, K) B (ldb >= K)
//
// float runs the kernel host::isa() chose for this CPU at run time
// (host/cpu.hpp): headroom's AVX-512 12 x 32 tile (sgemm/avx512.hpp) or its
// AVX2 + FMA 6 x 16 tile (sgemm/avx2.hpp), both behind sgemm/pack.hpp's
// driver and giving the same bits; double, and Isa::portable, run Eigen's
// sequential gebp kernel compiled with the build's own flags.
//
// The work is split over workers by rows of C (or columns, when C is wider
// than tall); each worker runs the sequential kernel on its block with its
// own panels (GemmBlocking in plan/graph.hpp sizes them; the plan holds them
// as the "gemm panels" workspace). Each element of C is computed by one
// worker, in one order: results depend only on the worker count and on
// whether the kernel is Eigen's or headroom's.
#include <Eigen/Core>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "../plan/graph.hpp"
#include "cpu.hpp"
#include "panels.hpp"
#include "parallel.hpp"
#include "sgemm/avx2.hpp"
#include "sgemm/avx512.hpp"
#include "sgemm/pack.hpp"

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
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    // beta is applied with the first chunk of K
    constexpr bool at = LhsOrder != Eigen::RowMajor, bt = RhsOrder != Eigen::RowMajor;
    switch (isa()) {
      case Isa::avx512:
        return sgemm::block<sgemm::Avx512, at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, panels, panel_elements);
      case Isa::avx2:
        return sgemm::block<sgemm::Avx2, at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, panels, panel_elements);
      case Isa::portable: break;
    }
  }
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
