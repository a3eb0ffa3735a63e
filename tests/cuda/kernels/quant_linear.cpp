// cuda/kernels/quant_linear.cuh: the quantized projection's forward and
// backward-input GEMMs (dequantization fused into the tiles) for NF4, NF4+DQ,
// Int4 and Int8 weights, float and bf16 storage, against
//   - a double-precision reference built element by element from
//     math::QuantView::at rounded to S (independent of any GEMM), and
//   - the host engine (host::quant_linear_forward / quant_linear_backward_input)
//     on the same S-rounded inputs and the same codes.
// Shapes are not multiples of the kernels' 64 x 64 tiles (N = 37, 5, 70;
// Out = 96, 40, 130; In = 192, 64, 128).
#include "../support/kernel_test.hpp"

#include <headroom/cuda/kernels/quant_linear.cuh>
#include <headroom/graph/graph.hpp>
#include <headroom/host/kernels/linear.hpp>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

using namespace headroom;
using cuda_test::Buffer;
using i64 = std::int64_t;

struct Format {
  QuantDesc desc;
  std::string_view name;
};
template <class Q>
constexpr Format format_of() {
  return {Q::desc, Q::name};
}
constexpr Format formats[] = {format_of<NF4>(), format_of<NF4DQ>(), format_of<Int4>(), format_of<Int8>()};

struct Shape {
  i64 n, in, out;
};
constexpr Shape shapes[] = {{37, 192, 96}, {5, 64, 40}, {70, 128, 130}};

// A weight matrix quantized on the host, as the trainer's weight loading does:
// codes, scales and tables in host vectors. w: (out, in) dense f32
struct HostWeight {
  std::vector<std::uint8_t> codes, scales;
  std::vector<float> table;
  math::QuantView view;
  HostWeight(QuantDesc q, i64 out, i64 in, const std::vector<float>& w)
      : codes(q.code_bytes(out * in)), scales(q.scale_bytes(out * in)), table(16 + 256),
        view{q, codes.data(), scales.data(), table.data(), out, in} {
    host::fill_quant_table(table.data(), q.double_quant);
    std::vector<float> staging(view.blocks());
    host::quantize_rows(view, 0, out, w.data(), staging.data());
    host::finish_double_quant(view, staging.data());
  }
};

// The same bytes on the device, and the view the kernels get.
struct QuantWeight {
  HostWeight host;
  Buffer<std::uint8_t> codes, scales;
  Buffer<float> table;
  math::QuantView device;
  QuantWeight(QuantDesc q, i64 out, i64 in, const std::vector<float>& w)
      : host(q, out, in, w), codes(host.codes), scales(host.scales), table(host.table),
        // Int formats have no table: the kernels must not need one.
        device{q, codes.get(), scales.get(), q.kind == QuantKind::nf4 ? table.get() : nullptr, out, in} {}
};

// Dense (out, in) weights whose block absmaxes differ (0.25 .. 3.25 by block),
// so that reading the wrong block's scale shows.
std::vector<float> weights(i64 out, i64 in, std::uint32_t seed) {
  std::vector<float> w = cuda_test::pattern(out * in, seed);
  for (i64 i = 0; i < out * in; ++i) w[i] *= 0.25f + 0.5f * static_cast<float>((i / 64) % 7);
  return w;
}

// deq(W) element by element from QuantView::at, rounded to S: (out, in).
template <class S>
std::vector<double> dequantized(const math::QuantView& w) {
  std::vector<double> d(w.rows * w.cols);
  for (i64 r = 0; r < w.rows; ++r)
    for (i64 c = 0; c < w.cols; ++c) d[r * w.cols + c] = cuda::to_float(cuda::from_float<S>(w.at(r, c)));
  return d;
}

// A reference value and the size of the terms that made it (sum |a| |b| +
// |bias| + |old value|): f32 accumulation error is bounded relative to that.
struct Reference {
  std::vector<double> value, magnitude;
};

// y (N, Out) = x deq(W)^T + bias (bias may be empty)
Reference forward_reference(const std::vector<float>& x, const std::vector<double>& w, const std::vector<float>& bias,
                            i64 n, i64 in, i64 out) {
  Reference ref{std::vector<double>(n * out), std::vector<double>(n * out)};
  for (i64 m = 0; m < n; ++m)
    for (i64 o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[o], mag = bias.empty() ? 0.0 : std::fabs(bias[o]);
      for (i64 k = 0; k < in; ++k) {
        s += x[m * in + k] * w[o * in + k];
        mag += std::fabs(x[m * in + k] * w[o * in + k]);
      }
      ref.value[m * out + o] = s;
      ref.magnitude[m * out + o] = mag;
    }
  return ref;
}

// dx (N, In) = dy deq(W) (+ old dx when accumulating)
Reference backward_reference(const std::vector<float>& dy, const std::vector<double>& w, const std::vector<float>& old,
                             bool first, i64 n, i64 in, i64 out) {
  Reference ref{std::vector<double>(n * in), std::vector<double>(n * in)};
  for (i64 m = 0; m < n; ++m)
    for (i64 k = 0; k < in; ++k) {
      double s = first ? 0.0 : old[m * in + k], mag = first ? 0.0 : std::fabs(old[m * in + k]);
      for (i64 o = 0; o < out; ++o) {
        s += dy[m * out + o] * w[o * in + k];
        mag += std::fabs(dy[m * out + o] * w[o * in + k]);
      }
      ref.value[m * in + k] = s;
      ref.magnitude[m * in + k] = mag;
    }
  return ref;
}

// Largest |got - ref| / (rtol |ref| + eps magnitude) (<= 1 passes; NaN fails).
double worst(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& magnitude,
             double rtol, double eps) {
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(got[i] - ref[i]) / (rtol * std::fabs(ref[i]) + eps * magnitude[i] + 1e-30);
    if (!(r <= w)) w = r;
  }
  return w;
}
double worst(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& magnitude,
             double rtol, double eps) {
  return worst(got, std::vector<double>(ref.begin(), ref.end()), magnitude, rtol, eps);
}

// Tolerances, relative to the reference (rtol) and to sum |a| |b| (eps):
// - f32 accumulation of K <= 192 products, in a different order than the
//   reference (double) or the host GEMM (f32, its own order): a strict bound is
//   K 2^-24 ~ 1.1e-5 of the magnitude; random signs keep it far below, 1e-5.
// - bf16 output: the f32 result rounds to bf16 once, at most 2^-8 of |value|
//   (round to nearest, 8 significant bits), after the same f32 accumulation
//   error (taken as 2e-5 of the magnitude to cover the rounding's share of it).
// - against the host engine with bf16 storage: the host dequantizes to f32, the
//   kernel to bf16 first (as bitsandbytes does), so each weight differs by up to
//   2^-8 of itself: 2^-8 more of the magnitude.
template <class S>
constexpr double output_rtol = std::is_same_v<S, float> ? 0.0 : 1.0 / 256;
template <class S>
constexpr double accumulation_eps = std::is_same_v<S, float> ? 1e-5 : 2e-5;
template <class S>
constexpr double host_weight_eps = std::is_same_v<S, float> ? 0.0 : 1.0 / 256;

// The host engine's scratch for one worker: GEMM panels and one 64-row
// dequantized panel of W.
struct HostScratch {
  std::vector<float> gemm, panel;
  host::GemmPanels<float> panels;
  HostScratch(i64 n, i64 in, i64 out)
      : gemm(GemmBlocking::panel_elements(n, in + out, in + out)), panel(host::quant_panel_rows(1) * in),
        panels{gemm.data(), static_cast<i64>(gemm.size())} {}
};

}  // namespace

TEMPLATE_TEST_CASE("cuda.quant_linear: forward y = x deq(W)^T (+ bias) matches the reference and the host engine",
                   "[cuda][quant]", float, cuda::bf16) {
  using S = TestType;
  for (const Format& f : formats)
    for (const Shape& s : shapes)
      for (const bool with_bias : {false, true}) {
        INFO(f.name << " n=" << s.n << " in=" << s.in << " out=" << s.out << " bias=" << with_bias);
        const QuantWeight w(f.desc, s.out, s.in, weights(s.out, s.in, 11));
        const std::vector<float> x = cuda_test::rounded<S>(cuda_test::pattern(s.n * s.in, 12));
        const std::vector<float> bias = with_bias ? cuda_test::rounded<S>(cuda_test::pattern(s.out, 13, 0.5f))
                                                  : std::vector<float>{};

        cuda_test::Buffer<S> dx(cuda_test::to_storage<S>(x));
        cuda_test::Buffer<S> dbias(with_bias ? cuda_test::to_storage<S>(bias) : std::vector<S>(1));
        cuda_test::Buffer<S> dy(cuda_test::to_storage<S>(cuda_test::pattern(s.n * s.out, 14, 100.0f)));  // overwritten
        cuda::quant_linear_forward<S>(dx.get(), w.device, with_bias ? dbias.get() : nullptr, dy.get(), s.n, nullptr);
        const std::vector<float> y = cuda_test::to_floats(dy.download());

        const Reference ref = forward_reference(x, dequantized<S>(w.host.view), bias, s.n, s.in, s.out);
        CHECK(worst(y, ref.value, ref.magnitude, output_rtol<S>, accumulation_eps<S>) <= 1.0);

        HostScratch scratch(s.n, s.in, s.out);
        std::vector<float> host_y(s.n * s.out);
        host::quant_linear_forward<float>(x.data(), w.host.view, host_y.data(), s.n, {.bias = with_bias ? bias.data() : nullptr},
                                          scratch.panel.data(), scratch.panels, 1);
        CHECK(worst(y, host_y, ref.magnitude, output_rtol<S>, accumulation_eps<S> + host_weight_eps<S>) <= 1.0);
      }
}

TEMPLATE_TEST_CASE("cuda.quant_linear: backward dx (+)= dy deq(W), overwritten and accumulated, matches the reference "
                   "and the host engine",
                   "[cuda][quant]", float, cuda::bf16) {
  using S = TestType;
  for (const Format& f : formats)
    for (const Shape& s : shapes)
      for (const bool first : {true, false}) {
        INFO(f.name << " n=" << s.n << " in=" << s.in << " out=" << s.out << " dx_first=" << first);
        const QuantWeight w(f.desc, s.out, s.in, weights(s.out, s.in, 21));
        const std::vector<float> dy = cuda_test::rounded<S>(cuda_test::pattern(s.n * s.out, 22));
        // first: garbage that must be overwritten; else: the gradient so far
        const std::vector<float> old = cuda_test::rounded<S>(cuda_test::pattern(s.n * s.in, 23, first ? 100.0f : 2.0f));

        cuda_test::Buffer<S> ddy(cuda_test::to_storage<S>(dy));
        cuda_test::Buffer<S> ddx(cuda_test::to_storage<S>(old));
        cuda::quant_linear_backward_input<S>(ddy.get(), w.device, ddx.get(), first, s.n, nullptr);
        const std::vector<float> dx = cuda_test::to_floats(ddx.download());

        const Reference ref = backward_reference(dy, dequantized<S>(w.host.view), old, first, s.n, s.in, s.out);
        CHECK(worst(dx, ref.value, ref.magnitude, output_rtol<S>, accumulation_eps<S>) <= 1.0);

        HostScratch scratch(s.n, s.in, s.out);
        std::vector<float> host_dx = old;
        host::quant_linear_backward_input<float>(dy.data(), w.host.view, host_dx.data(), first, s.n, scratch.panel.data(),
                                                 scratch.panels, 1);
        CHECK(worst(dx, host_dx, ref.magnitude, output_rtol<S>, accumulation_eps<S> + host_weight_eps<S>) <= 1.0);
      }
}

TEST_CASE("cuda.quant_linear: a quant block that is not a multiple of 32 is rejected", "[cuda][quant]") {
  const QuantDesc q{QuantKind::int8, 8, 16, false, 256};
  std::vector<std::uint8_t> codes(q.code_bytes(4 * 32)), scales(q.scale_bytes(4 * 32));
  const math::QuantView w{q, codes.data(), scales.data(), nullptr, 4, 32};
  std::vector<float> x(32), y(4);
  REQUIRE_THROWS_AS(cuda::quant_linear_forward<float>(x.data(), w, nullptr, y.data(), 1, nullptr), std::invalid_argument);
}
