// testing::test_layer over every built-in layer: f64 gradients of the input
// and of every parameter against central differences, and each step's
// writes and reads confined to the buffers the plan gave it (poisoned arena).
#include <catch2/catch.hpp>

#include "support/layer_check.hpp"

#include <algorithm>
#include <string>

#include <headroom/host/kernels/pointwise.hpp>
#include <headroom/host/op_context.hpp>

namespace {
using namespace headroom;

constexpr std::int64_t D = 8, F = 12;
using Q = Linear<16, 16>;
using KV = Linear<16, 8>;
using O = Linear<16, 16>;
}  // namespace

TEST_CASE("Linear, with and without bias", "[harness]") {
  check_layer<Linear<D, F>>();
  check_layer<Linear<D, F, true>>();
}

TEST_CASE("RMSNorm and LayerNorm", "[harness]") {
  check_layer<RMSNorm<D>>();
  check_layer<LayerNorm<D>>();
}

TEST_CASE("learned positions", "[harness]") { check_layer<LearnedPositions<8, D>>(); }

TEST_CASE("GELU MLP (the activation fused into the projection's epilogue)", "[harness]") {
  check_layer<MLP<D, F, Linear<D, F, true>, Linear<F, D, true>>>();
}

TEST_CASE("SwiGLU MLP", "[harness]") { check_layer<SwiGLU<D, F, Linear<D, F>, Linear<D, F>, Linear<F, D>>>(); }

TEST_CASE("attention: GQA with RoPE, and fused q|k|v", "[harness]") {
  check_layer<Attention<16, 4, 2, Positions::rope, Q, KV, KV, O>>();
  check_layer<FusedAttention<16, 4, Linear<16, 48, true>, Linear<16, 16, true>>>();
}

TEST_CASE("a residual block and a pre-norm transformer block", "[harness]") {
  check_layer<Residual<Sequential<RMSNorm<D>, Linear<D, D>>>>();
  using Block = PreNormBlock<LlamaBlockNames, RMSNorm<16>, Attention<16, 4, 2, Positions::rope, Q, KV, KV, O>, RMSNorm<16>,
                             SwiGLU<16, 24, Linear<16, 24>, Linear<16, 24>, Linear<24, 16>>>;
  check_layer<Block>();
  check_layer<Repeat<2, Block>>();
}

TEST_CASE("attention: per-head q / k norms with a head width apart from D / heads (Qwen3), a sliding window (Mistral)",
          "[harness]") {
  // 4 query heads of 6 (24 values, apart from D 16), 2 KV heads; RMSNorm over each head of q and k before RoPE
  using Normed = Attention<16, 4, 2, Positions::rope, Linear<16, 24>, Linear<16, 12>, Linear<16, 12>, Linear<24, 16>,
                           AttentionOptions{.head_dim = 6}, RMSNorm<6>>;
  check_layer<Normed>();
  // each of 8 positions sees itself and the 2 before it
  check_layer<Attention<16, 4, 2, Positions::rope, Q, KV, KV, O, AttentionOptions{.window = 3}>, Seq<8>>();
}

// The harness fails a layer whose gradient is wrong, and says so first.
namespace {
// y = 2x, with a backward that says dx = 3 dy: every element of the input
// gradient is off by half.
struct WrongGradientMath {
  template <class T>
  static T forward(T x) {
    return T(2) * x;
  }
  template <class T>
  static T backward(T, T dy) {
    return T(3) * dy;
  }
};
struct WrongGradientOp {
  static constexpr std::string_view name = "wrong_gradient";
  static constexpr ops::In<0> x{};
  static constexpr ops::Out<0> y{};
  static constexpr ops::Saved<0> x_saved{};
  static constexpr ops::Dim<0> features{};
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    host::map_forward<WrongGradientMath>(k[x], k[y], k.rows() * k[features], 1);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (T* dx = k.grad(x))
      host::map_backward<WrongGradientMath>(k[x_saved], k.grad(y), dx, k.first(x), k.rows() * k[features], 1);
  }
};
template <std::int64_t Dim>
struct WrongGradient {
  static constexpr std::string_view kind = "WrongGradient";
  static constexpr std::int64_t in_features = Dim, out_features = Dim;
  using children = type_list<>;
  using ops = type_list<WrongGradientOp>;
  static constexpr Ref build(graph::Builder& b, Ref in) {
    graph::Op op = headroom::ops::make<WrongGradientOp>();
    op.input(WrongGradientOp::x, in);
    op.save(WrongGradientOp::x_saved, in);
    op.set(WrongGradientOp::features, Dim);
    const Ref out = b.activation("y", Dim);
    op.output(WrongGradientOp::y, out);
    b.emit(op);
    return out;
  }
};
}  // namespace

TEST_CASE("the harness fails a layer whose gradient is wrong, and its summary line names the first failure", "[harness]") {
  const testing::LayerTestResult r = testing::test_layer<WrongGradient<D>>();
  INFO(r.report);
  CHECK_FALSE(r.passed);
  // the summary is the last line: FAILED, then the first failing element (token 0, feature 0 of the input gradient)
  const std::string summary = r.report.substr(r.report.rfind('\n') + 1);
  CHECK(summary.rfind("FAILED: the layer's input gradient (token 0, feature 0): analytic ", 0) == 0);
  CHECK(summary.find("more failures") != std::string::npos);
  CHECK(summary.find("largest relative error") != std::string::npos);
  // every element of the input gradient failed: 2 x 4 tokens x D features, 20 of them listed above the summary
  CHECK(r.elements_checked > 0);
  CHECK(std::count(r.report.begin(), r.report.end(), '\n') == 20);
}
