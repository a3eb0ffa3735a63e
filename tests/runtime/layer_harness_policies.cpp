// testing::test_layer over the policies and their mixes: LoRA, Quantized
// (NF4, int8), QLoRA, Frozen, Checkpointed and Offloaded, alone and combined.
#include <catch2/catch.hpp>

#include "support/layer_check.hpp"

namespace {
using namespace headroom;

constexpr std::int64_t D = 64, F = 16;  // NF4 blocks of 64 divide the row
using Block = Residual<Sequential<RMSNorm<D>, LoRA<4, Linear<D, D>>>>;
}  // namespace

TEST_CASE("LoRA over a dense and over a frozen projection", "[harness]") {
  check_layer<LoRA<4, Linear<D, F>>>();
  check_layer<LoRA<4, Linear<D, F, true>, Ratio<8>>>();
  check_layer<Frozen<Linear<D, F>>>();
}

TEST_CASE("Quantized projections, and QLoRA", "[harness]") {
  check_layer<Quantized<NF4, Linear<D, F>>>();
  check_layer<Quantized<Int8, Linear<D, F>>>();
  check_layer<LoRA<4, Quantized<NF4, Linear<D, F>>>>();
}

TEST_CASE("Checkpointed and Offloaded blocks", "[harness]") {
  check_layer<Checkpointed<Block>>();
  check_layer<Offloaded<Block>>();
  check_layer<Repeat<2, Checkpointed<Block>>>();
  check_layer<Checkpointed<Quantized<NF4, LoRA<4, Linear<D, D>>>>>();
}
