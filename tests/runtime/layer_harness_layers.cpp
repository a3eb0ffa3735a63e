// testing::test_layer over every built-in layer: f64 gradients of the input
// and of every parameter against central differences, and each step's
// writes and reads confined to the buffers the plan gave it (poisoned arena).
#include <catch2/catch.hpp>

#include "support/layer_check.hpp"

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
