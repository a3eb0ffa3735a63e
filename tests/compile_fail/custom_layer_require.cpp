// A user's layer checks its rule with HEADROOM_REQUIRE (docs/compile-time-errors.md).
// expect-gcc: BlockScale<In, Block>: the block size (64) must divide In (96)
// expect-clang: headroom::diag::values<64, 96>::hold<false>
// expect-clang: BlockScale<In, Block>: the block size ({}) must divide In ({})
#include <headroom/headroom.hpp>

template <std::int64_t In, std::int64_t Block>
struct BlockScale {
  HEADROOM_REQUIRE(In % Block == 0, "BlockScale<In, Block>: the block size ({}) must divide In ({})", Block, In);
  static constexpr std::int64_t blocks = In / Block;
};

constexpr auto n = sizeof(BlockScale<96, 64>);
