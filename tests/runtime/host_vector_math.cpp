// host/vector_math.hpp: the float exp / tanh / GELU / SwiGLU / cross-entropy
// the host kernels run, against the same formulas in double (math/*.hpp and
// std::exp), over ranges that include the clamps and odd row lengths (the
// 8-wide AVX2 body and the scalar tail both run), under every kernel choice
// this CPU has (host::use_isa: the scalar forms alone, and with AVX2).
#include <catch2/catch.hpp>

#include <headroom/host/cpu.hpp>
#include <headroom/host/vector_math.hpp>

#include "support/kernel_choice.hpp"
#include <headroom/math/activations.hpp>
#include <headroom/math/cross_entropy.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

namespace vec = headroom::host::vec;
namespace math = headroom::math;

std::vector<float> spread(int n, float lo, float hi) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = n == 1 ? lo : lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n - 1);
  return v;
}

// The element loops have two forms: the scalar one and, where the CPU has it, AVX2.
std::vector<headroom::host::Isa> element_loop_choices() {
  std::vector<headroom::host::Isa> v{headroom::host::Isa::portable};
  if (headroom::host::cpu_features().avx2_fma) v.push_back(headroom::host::Isa::avx2);
  return v;
}

using headroom::test::IsaScope;

}  // namespace

TEST_CASE("vec::exp: relative error within 3e-7 over the normal range, finite at the clamps", "[host][math]") {
  double worst = 0;
  for (float x : spread(200001, -87.0f, 88.0f)) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(vec::exp(x) - want) / want);
  }
  CHECK(worst < 3e-7);
  CHECK(std::isfinite(vec::exp(1000.0f)));
  CHECK(vec::exp(-1000.0f) >= 0.0f);
  CHECK(vec::exp(-1000.0f) < 2e-38f);
  CHECK(vec::exp(0.0f) == 1.0f);
}

TEST_CASE("vec rows: GELU, its backward and SwiGLU match math/activations.hpp in double", "[host][math]") {
  const auto isa = GENERATE(from_range(element_loop_choices()));
  const IsaScope scope(isa);
  INFO("element loops " << headroom::host::isa_name(isa));
  for (int n : {1, 7, 8, 9, 61, 1000}) {
    const auto x = spread(n, -12.0f, 12.0f);
    auto up = spread(n, 2.0f, -1.5f);
    std::vector<float> dy(n), y(n), dx(n, 0.25f), dg(n, -1.0f), du(n);
    for (int i = 0; i < n; ++i) dy[i] = 0.5f + 0.01f * static_cast<float>(i % 13);
    vec::gelu_rows(x.data(), y.data(), n);
    vec::gelu_backward_rows(x.data(), dy.data(), dx.data(), /*first=*/false, n);
    for (int i = 0; i < n; ++i) {
      const double xi = x[i];
      CHECK(y[i] == Approx(math::gelu_tanh(xi)).margin(2e-6).epsilon(2e-6));
      CHECK(dx[i] == Approx(0.25 + dy[i] * math::gelu_tanh_grad(xi)).margin(2e-6).epsilon(2e-6));
    }
    vec::swiglu_rows(x.data(), up.data(), y.data(), n);
    vec::swiglu_backward_rows(x.data(), up.data(), dy.data(), dg.data(), /*dgate_first=*/false, du.data(), /*dup_first=*/true, n);
    for (int i = 0; i < n; ++i) {
      double g, u;
      math::swiglu_backward(static_cast<double>(x[i]), static_cast<double>(up[i]), static_cast<double>(dy[i]), g, u);
      CHECK(y[i] == Approx(math::swiglu(static_cast<double>(x[i]), static_cast<double>(up[i]))).margin(2e-6).epsilon(2e-6));
      CHECK(dg[i] == Approx(-1.0 + g).margin(2e-6).epsilon(2e-6));
      CHECK(du[i] == Approx(u).margin(2e-6).epsilon(2e-6));
    }
  }
}

TEST_CASE("vec::cross_entropy_row: loss and gradient match math::cross_entropy_row in double", "[host][math]") {
  const auto isa = GENERATE(from_range(element_loop_choices()));
  const IsaScope scope(isa);
  INFO("element loops " << headroom::host::isa_name(isa));
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 4.0f);
  for (int vocab : {1, 5, 16, 17, 50257}) {
    std::vector<float> z(vocab);
    for (auto& v : z) v = d(rng);
    std::vector<double> zd(z.begin(), z.end());
    const int target = vocab / 3;
    const double want = math::cross_entropy_row(zd.data(), vocab, target, 0.125, true);
    const float got = vec::cross_entropy_row(z.data(), vocab, target, 0.125f, true);
    CHECK(got == Approx(want).epsilon(1e-5));
    double worst = 0;
    for (int v = 0; v < vocab; ++v) worst = std::max(worst, std::abs(z[v] - zd[v]));
    CHECK(worst < 1e-7);
  }
}
