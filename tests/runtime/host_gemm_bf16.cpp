// host/bf16.hpp and host::gemm on bf16 operands (float accumulation and C):
// the float -> bf16 rounding (ties to even, NaN, infinities, overflow)
// against hand-worked bit patterns; the product against a double reference
// of the same bf16 values in the four transpositions, with fringes (odd K
// included: the AVX512_BF16 tile takes k in pairs), alpha / beta, 1-3
// workers, guard elements after the plan-sized panels and guard columns in C,
// under every kernel this CPU runs (host::use_isa). Where the float tile runs
// on operands widened while packing, the result must equal, bit for bit, the
// float product of the widened copies.
// sanitizer build at -O1: a sweep of shapes and kernels, four times slower at -O0.
#include <catch2/catch.hpp>

#include <headroom/host/bf16.hpp>
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
using host::bf16;
using i64 = std::int64_t;

std::uint16_t bits_of(float f) { return host::to_bf16(f).bits; }
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<bf16> random_bf16(i64 n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = host::to_bf16(d(rng));
  return v;
}

using headroom::test::IsaScope;
const auto runnable = headroom::test::runnable_isas;

struct Case {
  i64 m, n, k;
};
const Case cases[] = {{1, 1, 1},      {7, 5, 3},      {12, 32, 8},   {13, 35, 257},  {25, 3, 70},
                      {200, 37, 513}, {35, 1100, 71}, {97, 130, 260}, {48, 96, 512}, {37, 70, 300}};

// pad: extra columns of A and B (0 keeps even leading dimensions, where the
// AVX512_BF16 packing moves k pairs as 32-bit words)
void check(bool ta, bool tb, Case s, float alpha, float beta, int workers, i64 pad) {
  const i64 M = s.m, N = s.n, K = s.k;
  const i64 lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + 2;
  const auto A = random_bf16((ta ? K : M) * lda, 1), B = random_bf16((tb ? N : K) * ldb, 2);
  std::vector<float> C0(static_cast<std::size_t>(M * ldc));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (auto& x : C0) x = d(rng);
  std::vector<float> C = C0;
  if (beta == 0.0f)
    for (i64 i = 0; i < M; ++i)
      for (i64 j = 0; j < N; ++j) C[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();  // must not be read
  const auto opa = [&](i64 i, i64 k) { return static_cast<double>(host::to_float(ta ? A[k * lda + i] : A[i * lda + k])); };
  const auto opb = [&](i64 k, i64 j) { return static_cast<double>(host::to_float(tb ? B[j * ldb + k] : B[k * ldb + j])); };
  const i64 per = GemmBlocking::panel_elements(M, N, K), guard = 64;
  const float sentinel = -12345.0f;
  std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(per * workers + guard), sentinel);
  const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
  host::gemm(t(ta), t(tb), M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc,
             host::GemmPanels<float>{panels.data(), per}, workers);
  INFO("ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K << " alpha " << alpha << " beta " << beta
             << " workers " << workers << " pad " << pad);
  for (i64 g = per * workers; g < per * workers + guard; ++g) REQUIRE(panels[static_cast<std::size_t>(g)] == sentinel);
  const double eps = std::numeric_limits<float>::epsilon();
  i64 bad = 0;
  for (i64 i = 0; i < M; ++i)
    for (i64 j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= N) {
        bad += got != C0[i * ldc + j];
        continue;
      }
      double sum = 0, mag = 0;
      for (i64 k = 0; k < K; ++k) {
        sum += opa(i, k) * opb(k, j);
        mag += std::abs(opa(i, k) * opb(k, j));
      }
      const double c0 = beta == 0.0f ? 0.0 : C0[i * ldc + j];
      const double ref = alpha * sum + beta * c0;
      const double tol = 4.0 * eps * (static_cast<double>(K + 2) * std::abs(alpha) * mag + std::abs(beta * c0)) + 1e-30;
      bad += !(std::abs(got - ref) <= tol);
    }
  REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("host::to_bf16: round to nearest even, NaN, infinities, overflow", "[host][bf16]") {
  CHECK(bits_of(1.0f) == 0x3f80);
  CHECK(bits_of(-2.0f) == 0xc000);
  CHECK(bits_of(from_bits(0x3f808000u)) == 0x3f80);  // a tie, to the even 0x3f80
  CHECK(bits_of(from_bits(0x3f818000u)) == 0x3f82);  // a tie, to the even 0x3f82
  CHECK(bits_of(from_bits(0x3f808001u)) == 0x3f81);  // above the tie
  CHECK(bits_of(from_bits(0x3f807fffu)) == 0x3f80);  // below it
  CHECK(bits_of(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits_of(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bits_of(std::numeric_limits<float>::max()) == 0x7f80);  // past bf16's largest finite: infinity
  CHECK(bits_of(from_bits(0x7f7f0000u)) == 0x7f7f);             // bf16's largest finite stays
  CHECK(bits_of(from_bits(0x00000001u)) == 0x0000);             // the smallest denormal rounds to 0
  CHECK(bits_of(from_bits(0x00018000u)) == 0x0002);             // a denormal tie, to even
  const std::uint16_t nan = bits_of(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);
  CHECK((bits_of(from_bits(0x7f800001u)) & 0x7f) != 0);  // a signalling NaN whose payload is in the low bits stays NaN
  CHECK(bits_of(from_bits(0xffc00000u)) == 0xffc0);
  for (std::uint32_t h = 0; h < 0x10000; h += 7) {  // every bf16 value is a float that converts back to itself
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0) continue;
    CHECK(bits_of(host::to_float(bf16{static_cast<std::uint16_t>(h)})) == h);
  }
}

TEST_CASE("host.gemm bf16: against a double reference, four transpositions, fringes", "[host][gemm][bf16]") {
  INFO(host::cpu_report());
  for (host::Isa i : runnable()) {
    INFO("kernels " << host::isa_name(i));
    const IsaScope scope(i);
    for (int tr = 0; tr < 4; ++tr) {
      int variant = 0;
      for (const Case& s : cases) {
        const float alphas[] = {1.0f, -0.75f, 2.5f}, betas[] = {0.0f, 1.0f, -0.5f};
        for (i64 pad : {0, 3})
          check((tr & 2) != 0, (tr & 1) != 0, s, alphas[variant % 3], betas[(variant / 3 + variant) % 3], 1 + variant % 3,
                pad);
        ++variant;
      }
    }
  }
}

TEST_CASE("host.gemm bf16: the widening path is the float product of the widened operands, to the bit",
          "[host][gemm][bf16]") {
  // On the float tiles a bf16 product only widens while packing (exact), so
  // it must give the float kernel's bits on float copies of the operands.
  for (host::Isa i : runnable()) {
    if (i == host::Isa::portable) continue;
    if (i == host::Isa::avx512 && host::cpu_features().avx512_bf16) continue;  // runs the pair tile instead
    const IsaScope scope(i);
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = (tr & 2) != 0, tb = (tr & 1) != 0;
      const i64 M = 97, N = 130, K = 261, lda = ta ? M : K, ldb = tb ? K : N;
      const auto A = random_bf16(M * K, 4), B = random_bf16(N * K, 5);
      std::vector<float> Af(A.size()), Bf(B.size()), c16(M * N), c32(M * N);
      for (std::size_t x = 0; x < A.size(); ++x) Af[x] = host::to_float(A[x]);
      for (std::size_t x = 0; x < B.size(); ++x) Bf[x] = host::to_float(B[x]);
      const i64 per = GemmBlocking::panel_elements(M, N, K);
      std::vector<float> panels(static_cast<std::size_t>(2 * per));
      const host::GemmPanels<float> ws{panels.data(), per};
      const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
      host::gemm(t(ta), t(tb), M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.0f, c16.data(), N, ws, 2);
      host::gemm(t(ta), t(tb), M, N, K, 0.7f, Af.data(), lda, Bf.data(), ldb, 0.0f, c32.data(), N, ws, 2);
      INFO("kernels " << host::isa_name(i) << " ta " << ta << " tb " << tb);
      REQUIRE(std::memcmp(c16.data(), c32.data(), c16.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("host.gemm bf16 C: each element is the float C's, rounded once, to the bit", "[host][gemm][bf16]") {
  // A bf16 C accumulates each (mc, nc) block in float in the panel and rounds
  // at the end, chunks of K in the float C's order: so it must equal
  // to_bf16 of the float C computed from the same operands (and, with beta,
  // from C's widened values), under every kernel, with 1-3 workers, the
  // panels the plan sizes, guard elements after them and guard columns in C.
  const Case shapes[] = {{1, 1, 1}, {13, 35, 257}, {200, 37, 513}, {35, 1100, 71}, {130, 700, 300}, {300, 1200, 64}};
  for (host::Isa i : runnable()) {
    const IsaScope scope(i);
    for (int tr = 0; tr < 4; ++tr)
      for (const Case& s : shapes)
        for (const float beta : {0.0f, 1.0f, -0.5f}) {
          const bool ta = (tr & 2) != 0, tb = (tr & 1) != 0;
          const i64 M = s.m, N = s.n, K = s.k, lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 3;
          const int workers = 1 + static_cast<int>((M + N) % 3);
          const auto A = random_bf16(M * K, 6), B = random_bf16(N * K, 7), C0 = random_bf16(M * ldc, 8);
          std::vector<bf16> c16 = C0;
          std::vector<float> c32(static_cast<std::size_t>(M * ldc));
          for (std::size_t x = 0; x < c32.size(); ++x) c32[x] = host::to_float(C0[x]);
          if (beta == 0.0f)  // must not be read
            for (i64 r = 0; r < M; ++r)
              for (i64 j = 0; j < N; ++j) c16[r * ldc + j] = host::to_bf16(std::numeric_limits<float>::quiet_NaN());
          const i64 per = GemmBlocking::panel_elements(M, N, K, true), guard = 64;
          const float sentinel = -12345.0f;
          std::vector<float, Eigen::aligned_allocator<float>> panels(static_cast<std::size_t>(per * workers + guard), sentinel);
          const host::GemmPanels<float> ws{panels.data(), per};
          const auto t = [](bool x) { return x ? host::Trans::yes : host::Trans::no; };
          host::gemm(t(ta), t(tb), M, N, K, 0.7f, A.data(), lda, B.data(), ldb, beta, c16.data(), ldc, ws, workers);
          for (i64 g = per * workers; g < per * workers + guard; ++g) REQUIRE(panels[static_cast<std::size_t>(g)] == sentinel);
          host::gemm(t(ta), t(tb), M, N, K, 0.7f, A.data(), lda, B.data(), ldb, beta, c32.data(), ldc, ws, workers);
          INFO("kernels " << host::isa_name(i) << " ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K
                          << " beta " << beta << " workers " << workers);
          i64 bad = 0;
          for (i64 r = 0; r < M; ++r)
            for (i64 j = 0; j < ldc; ++j) {
              const bf16 want = j < N ? host::to_bf16(c32[r * ldc + j]) : C0[r * ldc + j];
              bad += c16[r * ldc + j].bits != want.bits;
            }
          REQUIRE(bad == 0);
        }
  }
}
