// math/optim.hpp: AdamW against a plain double reference, SGD momentum, and
// 8-bit AdamW tracking f32 AdamW on a small problem.
#include <catch2/catch.hpp>

#include <headroom/math/optim.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {
using namespace headroom::math;
}

TEST_CASE("math.optim: AdamW matches a plain double reference over 10 steps", "[math][optim]") {
  const int n = 50;
  std::mt19937 rng(5);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(n), rm(n, 0.0), rv(n, 0.0);
  for (int i = 0; i < n; ++i) rp[i] = p[i] = static_cast<float>(d(rng));
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  const AdamWHyper<float> h{float(lr), float(b1), float(b2), float(eps), float(wd)};
  for (int t = 1; t <= 10; ++t) {
    const auto s = adamw_step(h, t);
    for (int i = 0; i < n; ++i) {
      const double g = std::sin(0.3 * i + t) + 0.1 * rp[i];
      // reference (torch.optim.AdamW)
      rp[i] *= 1 - lr * wd;
      rm[i] = b1 * rm[i] + (1 - b1) * g;
      rv[i] = b2 * rv[i] + (1 - b2) * g * g;
      const double mh = rm[i] / (1 - std::pow(b1, t)), vh = rv[i] / (1 - std::pow(b2, t));
      rp[i] -= lr * mh / (std::sqrt(vh) + eps);
      const float gf = static_cast<float>(std::sin(0.3 * i + t) + 0.1 * p[i]);
      adamw_update(p[i], m[i], v[i], gf, s);
    }
  }
  for (int i = 0; i < n; ++i) {
    REQUIRE(p[i] == Approx(rp[i]).margin(1e-5));
    REQUIRE(m[i] == Approx(rm[i]).margin(1e-5));
    REQUIRE(v[i] == Approx(rv[i]).margin(1e-6));
  }
  // first step moves each parameter by about lr (Adam's normalized step)
  float q = 1.0f, qm = 0.0f, qv = 0.0f;
  adamw_update(q, qm, qv, 3.0f, adamw_step(AdamWHyper<float>{0.1f, 0.9f, 0.999f, 1e-8f, 0.0f}, 1));
  REQUIRE(q == Approx(0.9f).epsilon(1e-5));
}

TEST_CASE("math.optim: SGD with momentum", "[math][optim]") {
  double p = 1.0, buf = 0.0;
  sgd_update(p, &buf, 2.0, 0.1, 0.9, 0.0);  // buf = 2, p = 0.8
  REQUIRE(buf == Approx(2.0));
  REQUIRE(p == Approx(0.8));
  sgd_update(p, &buf, 1.0, 0.1, 0.9, 0.5);  // g = 1 + 0.4 = 1.4; buf = 1.8 + 1.4 = 3.2; p = 0.8 - 0.32
  REQUIRE(buf == Approx(3.2));
  REQUIRE(p == Approx(0.48));
  double q = 1.0;
  sgd_update(q, static_cast<double*>(nullptr), 2.0, 0.1, 0.0, 0.0);
  REQUIRE(q == Approx(0.8));
}

TEST_CASE("math.optim: AdamW8bit tracks f32 AdamW", "[math][optim][adam8bit]") {
  // minimize sum_i c_i (p_i - target_i)^2 over n = 2 blocks + a partial block
  const int n = 256 * 2 + 100;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> target(n), c(n), p32(n), p8(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (int i = 0; i < n; ++i) {
    target[i] = d(rng);
    c[i] = 0.5f + std::fabs(d(rng));
    p32[i] = p8[i] = d(rng);
  }
  float map_s[256], map_u[256];
  make_dynamic_map(true, map_s);
  make_dynamic_map(false, map_u);
  const int blocks = (n + 255) / 256;
  std::vector<std::uint8_t> mq(n, dynamic_quantize_value(0.0f, map_s)), vq(n, dynamic_quantize_value(0.0f, map_u));
  std::vector<float> ma(blocks, 0.0f), va(blocks, 0.0f);
  const AdamWHyper<float> h{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f};
  double loss0 = 0.0;
  for (int i = 0; i < n; ++i) loss0 += c[i] * (p8[i] - target[i]) * (p8[i] - target[i]);
  double max_dev = 0.0, mean_dev = 0.0;
  const int steps = 500;
  for (int t = 1; t <= steps; ++t) {
    const auto s = adamw_step(h, t);
    for (int i = 0; i < n; ++i) adamw_update(p32[i], m[i], v[i], 2 * c[i] * (p32[i] - target[i]), s);
    for (int i = 0; i < n; ++i) g[i] = 2 * c[i] * (p8[i] - target[i]);
    for (int b = 0; b < blocks; ++b) {
      const int start = b * 256, len = std::min(256, n - start);
      adamw8bit_update_block(p8.data() + start, g.data() + start, len, mq.data() + start, vq.data() + start, &ma[b], &va[b],
                             map_s, map_u, s);
    }
    double dev = 0.0;
    for (int i = 0; i < n; ++i) { max_dev = std::fmax(max_dev, std::fabs(p8[i] - p32[i])); dev += std::fabs(p8[i] - p32[i]); }
    mean_dev = std::fmax(mean_dev, dev / n);
  }
  double final_dev = 0.0;
  for (int i = 0; i < n; ++i) {
    final_dev = std::fmax(final_dev, std::fabs(p8[i] - p32[i]));
  }
  double loss8 = 0.0, loss32 = 0.0;
  for (int i = 0; i < n; ++i) {
    loss8 += c[i] * (p8[i] - target[i]) * (p8[i] - target[i]);
    loss32 += c[i] * (p32[i] - target[i]) * (p32[i] - target[i]);
  }
  // stated tolerance: over 500 steps of lr 1e-2, the mean |p8 - p32| over the
  // parameters stays under 0.05 at every step (a few parameters drift further
  // apart, up to ~0.5, where the problem is far from converged: 8-bit moments
  // change the step size, not its direction); both optimizers bring the loss
  // under 1% of its start, and the 8-bit loss is within 2x of the f32 loss.
  INFO("max |p8 - p32| = " << max_dev << " worst mean " << mean_dev << " final max " << final_dev << ", loss0 " << loss0
                           << " loss32 " << loss32 << " loss8 " << loss8);
  REQUIRE(mean_dev < 0.05);
  REQUIRE(loss32 < 0.01 * loss0);
  REQUIRE(loss8 < 0.01 * loss0);
  REQUIRE(loss8 < 2.0 * loss32);
  REQUIRE(loss32 < 2.0 * loss8);
}
