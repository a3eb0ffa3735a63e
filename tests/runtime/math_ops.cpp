// math/activations.hpp, norms.hpp, rope.hpp, softmax.hpp: finite-difference
// checks in double, RoPE inverse = identity, online softmax vs two-pass.
#include <catch2/catch.hpp>

#include <headroom/math/cross_entropy.hpp>

#include <headroom/math/activations.hpp>
#include <headroom/math/norms.hpp>
#include <headroom/math/rope.hpp>
#include <headroom/math/softmax.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

using namespace headroom::math;

std::vector<double> randn(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

constexpr double h = 1e-6;

}  // namespace

TEST_CASE("math.activations: GELU tanh and SiLU derivatives", "[math][act]") {
  REQUIRE(gelu_tanh(0.0) == 0.0);
  REQUIRE(gelu_tanh(1.0) == Approx(0.8411919906082768));  // torch gelu(approximate="tanh")
  REQUIRE(silu(1.0) == Approx(0.7310585786300049));
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    const double fd_gelu = (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h);
    const double fd_silu = (silu(x + h) - silu(x - h)) / (2 * h);
    REQUIRE(gelu_tanh_grad(x) == Approx(fd_gelu).margin(1e-8));
    REQUIRE(silu_grad(x) == Approx(fd_silu).margin(1e-8));
  }
}

TEST_CASE("math.activations: SwiGLU backward", "[math][act]") {
  for (double gt = -4.0; gt <= 4.0; gt += 0.7) {
    for (double up = -2.0; up <= 2.0; up += 0.9) {
      const double dh = 0.7;
      double dg = 0, du = 0;
      swiglu_backward(gt, up, dh, dg, du);
      const double fd_g = dh * (swiglu(gt + h, up) - swiglu(gt - h, up)) / (2 * h);
      const double fd_u = dh * (swiglu(gt, up + h) - swiglu(gt, up - h)) / (2 * h);
      REQUIRE(dg == Approx(fd_g).margin(1e-8));
      REQUIRE(du == Approx(fd_u).margin(1e-8));
    }
  }
}

TEST_CASE("math.norms: RMSNorm backward vs finite differences", "[math][norm]") {
  const int d = 24;
  auto x = randn(d, 11), w = randn(d, 12), dy = randn(d, 13);
  std::vector<double> y(d), dx(d), dw(d, 0.0);
  double rstd = 0;
  rmsnorm_forward(x.data(), w.data(), d, 1e-5, y.data(), &rstd);
  double ss = 0;
  for (double v : x) ss += v * v;
  REQUIRE(rstd == Approx(1 / std::sqrt(ss / d + 1e-5)));
  rmsnorm_backward(x.data(), w.data(), dy.data(), d, rstd, dx.data(), dw.data());
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    std::vector<double> yy(d);
    double r;
    rmsnorm_forward(xx.data(), ww.data(), d, 1e-5, yy.data(), &r);
    double l = 0;
    for (int i = 0; i < d; ++i) l += dy[i] * yy[i];
    return l;
  };
  for (int i = 0; i < d; ++i) {
    auto xp = x, xm = x, wp = w, wm = w;
    xp[i] += h; xm[i] -= h; wp[i] += h; wm[i] -= h;
    REQUIRE(dx[i] == Approx((loss(xp, w) - loss(xm, w)) / (2 * h)).margin(1e-7));
    REQUIRE(dw[i] == Approx((loss(x, wp) - loss(x, wm)) / (2 * h)).margin(1e-7));
  }
}

TEST_CASE("math.norms: LayerNorm backward vs finite differences", "[math][norm]") {
  const int d = 20;
  auto x = randn(d, 21), w = randn(d, 22), b = randn(d, 23), dy = randn(d, 24);
  std::vector<double> y(d), dx(d), dw(d, 0.0), db(d, 0.0);
  double mean = 0, rstd = 0;
  layernorm_forward(x.data(), w.data(), b.data(), d, 1e-5, y.data(), &mean, &rstd);
  layernorm_backward(x.data(), w.data(), dy.data(), d, mean, rstd, dx.data(), dw.data(), db.data());
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww, const std::vector<double>& bb) {
    std::vector<double> yy(d);
    double mu, r;
    layernorm_forward(xx.data(), ww.data(), bb.data(), d, 1e-5, yy.data(), &mu, &r);
    double l = 0;
    for (int i = 0; i < d; ++i) l += dy[i] * yy[i];
    return l;
  };
  for (int i = 0; i < d; ++i) {
    auto xp = x, xm = x, wp = w, wm = w, bp = b, bm = b;
    xp[i] += h; xm[i] -= h; wp[i] += h; wm[i] -= h; bp[i] += h; bm[i] -= h;
    REQUIRE(dx[i] == Approx((loss(xp, w, b) - loss(xm, w, b)) / (2 * h)).margin(1e-7));
    REQUIRE(dw[i] == Approx((loss(x, wp, b) - loss(x, wm, b)) / (2 * h)).margin(1e-7));
    REQUIRE(db[i] == Approx((loss(x, w, bp) - loss(x, w, bm)) / (2 * h)).margin(1e-7));
  }
  // y has zero mean and unit variance before the affine part (w = 1, b = 0)
  std::vector<double> ones(d, 1.0), yy(d);
  double mu, r;
  layernorm_forward(x.data(), ones.data(), static_cast<const double*>(nullptr), d, 0.0, yy.data(), &mu, &r);
  double s = 0, s2 = 0;
  for (double v : yy) { s += v; s2 += v * v; }
  REQUIRE(s / d == Approx(0.0).margin(1e-12));
  REQUIRE(s2 / d == Approx(1.0));
}

TEST_CASE("math.rope: Llama 3.1's scaled frequencies are transformers' (meta-llama/Llama-3.1-8B's config)",
          "[math][rope]") {
  // inv_freq of head_dim 128, rope_theta 500000, rope_scaling {factor 8,
  // low_freq_factor 1, high_freq_factor 4, original 8192}: the values
  // transformers' _compute_llama3_parameters gives, computed in float64 by
  // tests/parity/torch_models.py's transcription of it (llama3_inv_freq).
  const headroom::math::RopeScaling s{8, 1, 4, 8192};
  struct Pin {
    int i;
    double unscaled, scaled;
  };
  for (const Pin p : {Pin{0, 1.0, 1.0},                                                // wavelength 6.3: kept
                      Pin{28, 0.0032114459947525913, 0.0032114459947525913},          // 1956 < 8192 / 4: kept
                      Pin{29, 0.0026160992529250353, 0.002166570763503359},           // 2402: blended
                      Pin{32, 0.001414213562373095, 0.0005248461609929547},           // 4443: blended
                      Pin{34, 0.0009384738703573801, 0.00017850781276799638},         // 6695: blended
                      Pin{35, 0.0007644969883171747, 9.556212353964683e-05},          // 8219 > 8192: / 8
                      Pin{63, 2.455140791131609e-06, 3.068925988914511e-07}}) {       // / 8
    INFO("pair " << p.i);
    CHECK(headroom::math::rope_inv_freq(p.i, 128, 500000.0) == Approx(p.unscaled).epsilon(1e-14));
    CHECK(headroom::math::rope_inv_freq(p.i, 128, 500000.0, s) == Approx(p.scaled).epsilon(1e-14));
  }
  // rope_rotate turns pair 35 by p * its scaled frequency
  std::vector<double> e(128, 0.0);
  e[35] = 1.0;
  rope_rotate(e.data(), 128, 1000, 500000.0, false, s);
  CHECK(e[35] == Approx(std::cos(1000 * 9.556212353964683e-05)));
  CHECK(e[35 + 64] == Approx(std::sin(1000 * 9.556212353964683e-05)));
}

TEST_CASE("math.rope: pairing, norm preservation and inverse", "[math][rope]") {
  const int hd = 16;
  auto x = randn(hd, 31);
  SECTION("position 0 is the identity; inverse undoes the forward") {
    auto y = x;
    rope_rotate(y.data(), hd, 0);
    for (int i = 0; i < hd; ++i) REQUIRE(y[i] == x[i]);
    for (int p : {1, 7, 4095}) {
      y = x;
      rope_rotate(y.data(), hd, p);
      double n0 = 0, n1 = 0;
      for (int i = 0; i < hd; ++i) { n0 += x[i] * x[i]; n1 += y[i] * y[i]; }
      REQUIRE(n1 == Approx(n0));
      rope_rotate(y.data(), hd, p, 10000.0, true);
      for (int i = 0; i < hd; ++i) REQUIRE(y[i] == Approx(x[i]).margin(1e-12));
    }
  }
  SECTION("element 0 pairs with element d/2 at frequency 1") {
    std::vector<double> e(hd, 0.0);
    e[0] = 1.0;
    rope_rotate(e.data(), hd, 3);
    REQUIRE(e[0] == Approx(std::cos(3.0)));
    REQUIRE(e[hd / 2] == Approx(std::sin(3.0)));
    for (int i = 1; i < hd; ++i) if (i != hd / 2) REQUIRE(e[i] == 0.0);
    // pair 1 rotates by p * 10000^(-2/d)
    std::vector<double> f(hd, 0.0);
    f[1] = 1.0;
    rope_rotate(f.data(), hd, 5);
    const double a = 5.0 * std::pow(10000.0, -2.0 / hd);
    REQUIRE(f[1] == Approx(std::cos(a)));
    REQUIRE(f[1 + hd / 2] == Approx(std::sin(a)));
  }
  SECTION("relative position: <R(p)q, R(p')k> depends on p - p' only") {
    auto q = randn(hd, 32), k = randn(hd, 33);
    auto dot_at = [&](int pq, int pk) {
      auto a = q, b = k;
      rope_rotate(a.data(), hd, pq);
      rope_rotate(b.data(), hd, pk);
      double s = 0;
      for (int i = 0; i < hd; ++i) s += a[i] * b[i];
      return s;
    };
    REQUIRE(dot_at(10, 3) == Approx(dot_at(107, 100)));
  }
}

TEST_CASE("math.softmax: online statistics equal two-pass", "[math][softmax]") {
  auto x = randn(1000, 41);
  for (auto& v : x) v *= 10;
  double m = -INFINITY;
  for (double v : x) m = std::fmax(m, v);
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  const double lse = m + std::log(s);

  OnlineSoftmax<double> one;
  for (double v : x) one.update(v);
  REQUIRE(one.m == m);
  REQUIRE(one.lse() == Approx(lse));

  // chunks merged, each with a rescaled accumulator (as flash attention does)
  OnlineSoftmax<double> total;
  double acc = 0.0;  // sum_j exp(x_j - m) * j
  for (int c = 0; c < 1000; c += 64) {
    OnlineSoftmax<double> part;
    double part_acc = 0.0;
    for (int j = c; j < std::min(1000, c + 64); ++j) {
      part_acc *= part.update(x[j]);
      part_acc += std::exp(x[j] - part.m) * j;
    }
    double other = 0.0;
    const double mine = total.merge(part, &other);
    acc = acc * mine + part_acc * other;
  }
  REQUIRE(total.lse() == Approx(lse));
  double ref = 0.0;
  for (int j = 0; j < 1000; ++j) ref += std::exp(x[j] - lse) * j;
  REQUIRE(acc / total.s == Approx(ref));
  double psum = 0.0;
  for (double v : x) psum += total.prob(v);
  REQUIRE(psum == Approx(1.0));

  OnlineSoftmax<float> f;
  float fx[3] = {1.0f, 3.0f, 2.0f};
  f.update(fx, 3);
  REQUIRE(f.lse() == Approx(std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0))));
}

TEST_CASE("cross_entropy_row: loss against log-softmax, gradient against finite differences", "[math]") {
  const double base[5] = {0.3, -1.2, 2.5, 0.0, 1.1};
  double z[5];
  for (int i = 0; i < 5; ++i) z[i] = base[i];
  double naive_sum = 0;
  for (double v : base) naive_sum += std::exp(v);
  const double loss = headroom::math::cross_entropy_row(z, 5, 2, 0.5, true);
  CHECK(loss == Approx(std::log(naive_sum) - base[2]).epsilon(1e-14));
  for (int i = 0; i < 5; ++i) {
    double zp[5], zm[5];
    for (int k = 0; k < 5; ++k) zp[k] = zm[k] = base[k];
    zp[i] += 1e-6;
    zm[i] -= 1e-6;
    const double fd = (headroom::math::cross_entropy_row(zp, 5, 2, 1.0, false) -
                       headroom::math::cross_entropy_row(zm, 5, 2, 1.0, false)) / 2e-6;
    CHECK(z[i] == Approx(0.5 * fd).epsilon(1e-7));  // grad_scale 0.5
  }
}
