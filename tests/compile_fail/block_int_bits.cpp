// 6-bit block integers do not exist.
// expect-gcc: BlockInt<Bits, Block>: Bits must be 8 or 4 (it is 6)
// expect-clang: headroom::diag::values<6>::hold<false>
// expect-clang: BlockInt<Bits, Block>: Bits must be 8 or 4 (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(BlockInt<6, 64>);
