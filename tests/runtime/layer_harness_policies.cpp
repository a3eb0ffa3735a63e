// testing::test_layer over the policies and their mixes: LoRA, Quantized
// (NF4, int8), QLoRA, Frozen, Checkpointed and Offloaded, alone and combined.
#include <catch2/catch.hpp>

#include <headroom/testing/layer_test.hpp>

namespace {
using namespace headroom;

template <class L, class... Options>
void check() {
  const testing::LayerTestResult r = testing::test_layer<L, Options...>();
  INFO(r.report);
  CHECK(r.passed);
  CHECK(r.elements_checked > 0);
  CHECK(r.steps_checked > 0);
}

constexpr std::int64_t D = 64, F = 16;  // NF4 blocks of 64 divide the row
using Block = Residual<Sequential<RMSNorm<D>, LoRA<4, Linear<D, D>>>>;
}  // namespace

TEST_CASE("LoRA over a dense and over a frozen projection", "[harness]") {
  check<LoRA<4, Linear<D, F>>>();
  check<LoRA<4, Linear<D, F, true>, Ratio<8>>>();
  check<Frozen<Linear<D, F>>>();
}

TEST_CASE("Quantized projections, and QLoRA", "[harness]") {
  check<Quantized<NF4, Linear<D, F>>>();
  check<Quantized<Int8, Linear<D, F>>>();
  check<LoRA<4, Quantized<NF4, Linear<D, F>>>>();
}

TEST_CASE("Checkpointed and Offloaded blocks", "[harness]") {
  check<Checkpointed<Block>>();
  check<Offloaded<Block>>();
  check<Repeat<2, Checkpointed<Block>>>();
  check<Checkpointed<Quantized<NF4, LoRA<4, Linear<D, D>>>>>();
}
