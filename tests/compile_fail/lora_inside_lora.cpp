// A hand-written stack with two adapters (one under Frozen) on one projection.
// expect-gcc: LoRA<Rank, L>: a projection takes at most one LoRA adapter, and L already has 1
// expect-clang: headroom::diag::values<1>::hold<false>
// expect-clang: LoRA<Rank, L>: a projection takes at most one LoRA adapter, and L already has {}
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<8, Frozen<LoRA<4, Linear<64, 64>>>>);
