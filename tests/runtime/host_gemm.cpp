// host/gemm.hpp: host::gemm and host::gemm_serial against a naive reference
// in double, in the four transposition cases, on sizes with fringes (M, N, K
// not multiples of the 6 x 16 register tile or of the kc / mc / nc blocks,
// K > kc, M > mc, N > nc), alpha != 1, beta 0 / 1 / other, and leading
// dimensions wider than the matrices. Panels are exactly the plan's size
// (GemmBlocking::panel_elements) with guard elements after them, C has guard
// columns (ldc > N): nothing may be written outside. beta 0 must not read C
// (C starts as NaN). Repeated runs are bit-identical. float runs every kernel
// this CPU can (host::use_isa: Eigen's product, the AVX2 tile, the AVX-512
// tile), and headroom's tiles must give the same bits; double runs Eigen's.
// sanitizer build at -O1: a sweep of shapes and kernels, four times slower at -O0.
#include <catch2/catch.hpp>

#include <headroom/host/gemm.hpp>

#include "support/kernel_choice.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace host = headroom::host;
using headroom::GemmBlocking;
using i64 = std::int64_t;

template <class T>
std::vector<T> uniform(i64 n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

struct Case {
  i64 m, n, k;
};

template <class T>
void check(bool ta, bool tb, Case s, double alpha, double beta, int workers, bool serial, i64 pad) {
  const i64 M = s.m, N = s.n, K = s.k;
  // A stored (M, K) or (K, M), B (K, N) or (N, K), each with `pad` extra columns
  const i64 a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const i64 lda = a_cols + pad, ldb = b_cols + pad + 1, ldc = N + pad + 2;
  const auto A = uniform<T>(a_rows * lda, 1), B = uniform<T>(b_rows * ldb, 2);
  const auto C0 = uniform<T>(M * ldc, 3);
  std::vector<T> C = C0;
  if (beta == 0.0)  // must not be read
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) C[i * ldc + j] = std::numeric_limits<T>::quiet_NaN();
  const auto opa = [&](i64 i, i64 k) { return static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]); };
  const auto opb = [&](i64 k, i64 j) { return static_cast<double>(tb ? B[j * ldb + k] : B[k * ldb + j]); };

  const i64 per = GemmBlocking::panel_elements(M, N, K);
  const i64 guard = 64, slots = serial ? 1 : workers;
  const T sentinel = static_cast<T>(-12345.0);
  // 64-byte aligned, as the plan's buffer is (Eigen's packing stores aligned vectors)
  std::vector<T, Eigen::aligned_allocator<T>> panels(static_cast<std::size_t>(per * slots + guard), sentinel);
  const host::GemmPanels<T> ws{panels.data(), per};
  const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
  const auto run = [&](std::vector<T>& c) {
    if (serial) host::gemm_serial(t(ta), t(tb), M, N, K, T(alpha), A.data(), lda, B.data(), ldb, T(beta), c.data(), ldc, ws, 0);
    else host::gemm(t(ta), t(tb), M, N, K, T(alpha), A.data(), lda, B.data(), ldb, T(beta), c.data(), ldc, ws, workers);
  };
  std::vector<T> again = C;
  run(C);
  run(again);

  INFO("ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K << " alpha " << alpha << " beta " << beta
             << " workers " << workers << " serial " << serial << " pad " << pad);
  for (i64 g = per * slots; g < per * slots + guard; ++g) REQUIRE(panels[static_cast<std::size_t>(g)] == sentinel);
  const double eps = std::numeric_limits<T>::epsilon();
  i64 bad = 0;
  for (i64 i = 0; i < M; ++i) {
    for (i64 j = 0; j < ldc; ++j) {
      const T got = C[i * ldc + j];
      if (j >= N) {  // outside C: untouched
        if (got != C0[i * ldc + j]) ++bad;
        continue;
      }
      double sum = 0, mag = 0;
      for (i64 k = 0; k < K; ++k) {
        sum += opa(i, k) * opb(k, j);
        mag += std::abs(opa(i, k) * opb(k, j));
      }
      const double c0 = beta == 0.0 ? 0.0 : static_cast<double>(C0[i * ldc + j]);
      const double ref = alpha * sum + beta * c0;
      const double tol = 4.0 * eps * (static_cast<double>(K + 2) * std::abs(alpha) * mag + std::abs(beta * c0)) + 1e-30;
      if (!(std::abs(static_cast<double>(got) - ref) <= tol)) ++bad;
      if (std::memcmp(&got, &again[i * ldc + j], sizeof(T)) != 0) ++bad;  // deterministic
    }
  }
  REQUIRE(bad == 0);
}

// Sizes: tiny, fringes of the 6 x 16 and 12 x 32 tiles, K > kc (256) and not a multiple of
// 8, M > mc (192), N > nc (1024), tall and wide (the split goes by rows or by
// columns), and small products whose zero-padded slivers do not fit the
// plan's panels at full kc.
const Case cases[] = {{1, 1, 1},     {1, 1, 300},   {7, 5, 3},     {6, 16, 8},    {17, 17, 256}, {13, 35, 257},
                      {25, 3, 70},   {200, 37, 513}, {385, 49, 31}, {35, 1100, 70}, {3, 2100, 19}, {97, 130, 260},
                      {12, 32, 9},   {25, 65, 300}};

using headroom::test::IsaScope;
const auto runnable = headroom::test::runnable_isas;

template <class T>
void all_cases(int workers, bool serial) {
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = (tr & 2) != 0, tb = (tr & 1) != 0;
    int variant = 0;
    for (const Case& s : cases) {
      const double alphas[] = {1.0, -0.75, 2.5};
      const double betas[] = {0.0, 1.0, -0.5};
      const double alpha = alphas[variant % 3], beta = betas[(variant / 3 + variant) % 3];
      check<T>(ta, tb, s, alpha, beta, workers, serial, variant % 2 == 0 ? 0 : 5);
      ++variant;
    }
  }
}

void alignment_case() {
  const i64 M = 50, N = 70, K = 300;
  const auto A = uniform<float>(M * K, 4), B = uniform<float>(N * K, 5);
  const i64 per = GemmBlocking::panel_elements(M, N, K);
  std::vector<float> ref(M * N), got(M * N);
  std::vector<float> panels(static_cast<std::size_t>(per + 16));
  host::gemm(host::Trans::no, host::Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, ref.data(), N,
             host::GemmPanels<float>{panels.data(), per}, 1);
  for (int offset = 1; offset < 16; offset += 5) {
    host::gemm(host::Trans::no, host::Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, got.data(), N,
               host::GemmPanels<float>{panels.data() + offset, per}, 1);
    REQUIRE(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("host.gemm: float vs a double reference, four transpositions, fringes", "[host][gemm]") {
  INFO(host::cpu_report());
  for (host::Isa i : runnable()) {
    INFO("kernels " << host::isa_name(i));
    const IsaScope scope(i);
    for (int workers : {1, 2, 3}) all_cases<float>(workers, false);
    all_cases<float>(1, true);
  }
}

TEST_CASE("host.gemm: headroom's tiles sum in the stated order, to the bit", "[host][gemm]") {
  // sgemm/pack.hpp: each element of C sums k in chunks of kc (256), one FMA per
  // k in increasing order from 0, then alpha acc + beta C per chunk (beta only
  // for the first). The same order written out in scalar std::fma must give
  // the same bits as every x86 tile this CPU runs: so they agree with each
  // other, whatever their shape.
  const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
  for (const Case& s : {Case{200, 37, 513}, Case{35, 1100, 70}, Case{97, 130, 260}, Case{25, 65, 300}})
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = (tr & 2) != 0, tb = (tr & 1) != 0;
      const i64 M = s.m, N = s.n, K = s.k, lda = ta ? M : K, ldb = tb ? K : N;
      const auto A = uniform<float>(M * K, 7), B = uniform<float>(N * K, 8), C0 = uniform<float>(M * N, 9);
      const float alpha = 0.7f, beta = -1.0f;  // alpha not a power of 2: alpha acc rounds
      std::vector<float> ref = C0;
      for (i64 i = 0; i < M; ++i)
        for (i64 j = 0; j < N; ++j) {
          float c = ref[i * N + j];
          for (i64 pc = 0; pc < K; pc += GemmBlocking::kc) {
            float acc = 0.0f;
            for (i64 k = pc; k < K && k < pc + GemmBlocking::kc; ++k)
              acc = std::fma(ta ? A[k * lda + i] : A[i * lda + k], tb ? B[j * ldb + k] : B[k * ldb + j], acc);
            c = std::fma(alpha, acc, pc == 0 ? beta * c : c);
          }
          ref[i * N + j] = c;
        }
      const i64 per = GemmBlocking::panel_elements(M, N, K);
      std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(2 * per));
      for (host::Isa i : runnable()) {
        if (i == host::Isa::portable) continue;  // Eigen's product sums in its own order
        std::vector<float> got = C0;
        {
          const IsaScope scope(i);
          host::gemm(t(ta), t(tb), M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), N,
                     host::GemmPanels<float>{panels.data(), per}, 2);
        }
        INFO("kernels " << host::isa_name(i) << " ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K);
        REQUIRE(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("host.gemm: every alpha / beta combination on one shape", "[host][gemm]") {
  for (host::Isa i : runnable()) {
    const IsaScope scope(i);
    for (double alpha : {1.0, 0.5, -3.0})
      for (double beta : {0.0, 1.0, 0.25, -1.0})
        for (int tr = 0; tr < 4; ++tr) check<float>((tr & 2) != 0, (tr & 1) != 0, {29, 45, 270}, alpha, beta, 2, false, 3);
  }
}

TEST_CASE("host.gemm: K = 0 or alpha = 0 only scales C by beta", "[host][gemm]") {
  for (double beta : {0.0, 1.0, 0.5}) {
    check<float>(false, true, {9, 21, 0}, 1.0, beta, 1, false, 2);
    check<float>(true, false, {9, 21, 40}, 0.0, beta, 2, false, 2);
  }
}

TEST_CASE("host.gemm: float results do not depend on panel alignment", "[host][gemm]") {
  // The plan may hand a worker a region that is not 64-byte aligned (per_worker
  // from bytes / workers): headroom's float tiles use unaligned accesses only.
  for (host::Isa i : runnable()) {
    if (i == host::Isa::portable) continue;  // Eigen's packing stores aligned vectors
    const IsaScope scope(i);
    alignment_case();
  }
}

