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
// sequential gebp kernel compiled with the build's own flags. bf16 operands
// (host/bf16.hpp) with a float C run the AVX512_BF16 tile
// (sgemm/avx512_bf16.hpp) where the CPU has it, else the float tile on
// operands widened while packing, else a scalar loop.
//
// The work is split over workers by rows of C (or columns, when C is wider
// than tall); each worker runs the sequential kernel on its block with its
// own panels (GemmBlocking in core/workspace.hpp sizes them; the plan holds them
// as the "gemm panels" workspace). Each element of C is computed by one
// worker, in one order: results depend only on the worker count and on
// whether the kernel is Eigen's or headroom's.
#include <Eigen/Core>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "../core/workspace.hpp"
#include "cpu.hpp"
#include "panels.hpp"
#include "parallel.hpp"
#include "sgemm/avx2.hpp"
#include "sgemm/avx512.hpp"
#include "sgemm/avx512_bf16.hpp"
#include "sgemm/pack.hpp"
#include "storage.hpp"

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

// 16-bit operands (bf16, f16) where no x86 kernel runs: each element of C
// sums k in float, chunk by chunk of kc as the tiles do, then alpha acc (+
// beta C); a 16-bit C is rounded once, at the end.
template <bool a_trans, bool b_trans, class H, class Out>
void gemm_half_scalar(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const H* A, std::int64_t lda, const H* B,
                      std::int64_t ldb, float beta, Out* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      float c = beta == 0.0f ? 0.0f : beta * widen(C[i * ldc + j]);
      for (std::int64_t pc = 0; pc < K; pc += GemmBlocking::kc) {
        float acc = 0.0f;
        for (std::int64_t k = pc; k < K && k < pc + GemmBlocking::kc; ++k)
          acc += to_float(a_trans ? A[k * lda + i] : A[i * lda + k]) * to_float(b_trans ? B[j * ldb + k] : B[k * ldb + j]);
        c = alpha * acc + c;
      }
      C[i * ldc + j] = narrow<Out>(c);
    }
}

// One worker's block, sequentially, with its panels. In, the operands'
// type, is T, or bf16 / f16 with T float (float accumulation); Out, C's
// type, is T, or In with 16-bit operands.
template <class T, int LhsOrder, int RhsOrder, class In = T, class Out = T>
void gemm_block(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const In* A, std::int64_t lda, const In* B,
                std::int64_t ldb, T beta, Out* C, std::int64_t ldc, T* panels, std::int64_t panel_elements) {
  static_assert(std::is_same_v<In, T> || (half_storage<In> && std::is_same_v<T, float>),
                "host::gemm: the operands are T, or bf16 / f16 with a float C");
  static_assert(std::is_same_v<Out, T> || (half_storage<Out> && std::is_same_v<In, Out>),
                "host::gemm: C is T, or bf16 / f16 with operands of its type");
  if (M <= 0 || N <= 0) return;
  const auto scale_c = [&] {
    for (std::int64_t i = 0; i < M; ++i) {
      Out* row = C + i * ldc;
      if (beta == T(0)) {
        for (std::int64_t j = 0; j < N; ++j) row[j] = Out{};
      } else if (beta != T(1)) {
        for (std::int64_t j = 0; j < N; ++j) row[j] = narrow<Out>(widen(row[j]) * beta);
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
  constexpr bool at = LhsOrder != Eigen::RowMajor, bt = RhsOrder != Eigen::RowMajor;
#if HEADROOM_X86_KERNELS
  if constexpr (std::is_same_v<T, float>) {
    // beta is applied with the first chunk of K
    switch (isa()) {
      case Isa::avx512:
        if constexpr (std::is_same_v<In, bf16>)
          if (cpu_features().avx512_bf16)
            return sgemm::block<sgemm::Avx512Bf16, at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, panels,
                                                           panel_elements);
        return sgemm::block<sgemm::Avx512, at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, panels, panel_elements);
      case Isa::avx2:
        return sgemm::block<sgemm::Avx2, at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, panels, panel_elements);
      case Isa::portable: break;
    }
  }
#endif
  if constexpr (half_storage<In>) {
    gemm_half_scalar<at, bt>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    static_assert(std::is_same_v<Out, T>);
    scale_c();
    ArenaBlocking<T> blocking(panels, panels + size_a, mc, nc, kc);
    Eigen::internal::general_matrix_matrix_product<Eigen::Index, T, LhsOrder, false, T, RhsOrder, false,
                                                   Eigen::RowMajor, 1>::run(M, N, K, A, lda, B, ldb, C, 1, ldc, alpha,
                                                                            blocking, nullptr);
  }
}

template <class T, int LhsOrder, int RhsOrder, class In, class Out>
void gemm_split(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const In* A, std::int64_t lda, const In* B,
                std::int64_t ldb, T beta, Out* C, std::int64_t ldc, const GemmPanels<T>& ws, int workers) {
  // element (i, k) of op(A) / (k, j) of op(B)
  const bool a_rows = LhsOrder == Eigen::RowMajor, b_rows = RhsOrder == Eigen::RowMajor;
  const bool by_rows = M >= N;
  team(workers, [&](int w, int count) {
    const Range r = share(by_rows ? M : N, count, w);
    if (r.size() <= 0) return;
    if (by_rows) {
      const In* a = a_rows ? A + r.begin * lda : A + r.begin;
      gemm_block<T, LhsOrder, RhsOrder, In, Out>(r.size(), N, K, alpha, a, lda, B, ldb, beta, C + r.begin * ldc, ldc, ws.of(w),
                                        ws.per_worker);
    } else {
      const In* b = b_rows ? B + r.begin : B + r.begin * ldb;
      gemm_block<T, LhsOrder, RhsOrder, In, Out>(M, r.size(), K, alpha, A, lda, b, ldb, beta, C + r.begin, ldc, ws.of(w),
                                        ws.per_worker);
    }
  });
}

}  // namespace detail

enum class Trans : bool { no = false, yes = true };

// In is T, or bf16 / f16 with T float: 16-bit operands, float accumulation
// (bf16: the AVX512_BF16 tile where the CPU has it; else, and for f16,
// widened to float while packing and run on the float tile). Out is T, or
// In with 16-bit operands: each element is then the float C's, rounded once.
template <class T, class In, class Out>
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const In* A, std::int64_t lda,
          const In* B, std::int64_t ldb, T beta, Out* C, std::int64_t ldc, const GemmPanels<T>& ws, int workers) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (ta == Trans::no && tb == Trans::no) detail::gemm_split<T, R, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else if (ta == Trans::no) detail::gemm_split<T, R, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else if (tb == Trans::no) detail::gemm_split<T, Cm, R>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
  else detail::gemm_split<T, Cm, Cm>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws, workers);
}

// The same product on the calling thread only, with worker w's panels (for
// kernels that already run inside a team).
template <class T, class In, class Out>
void gemm_serial(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const In* A, std::int64_t lda,
                 const In* B, std::int64_t ldb, T beta, Out* C, std::int64_t ldc, const GemmPanels<T>& ws, int w) {
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  T* p = ws.of(w);
  const std::int64_t n = ws.per_worker;
  if (ta == Trans::no && tb == Trans::no) detail::gemm_block<T, R, R, In, Out>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else if (ta == Trans::no) detail::gemm_block<T, R, Cm, In, Out>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else if (tb == Trans::no) detail::gemm_block<T, Cm, R, In, Out>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
  else detail::gemm_block<T, Cm, Cm, In, Out>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, n);
}

}  // namespace headroom::host
