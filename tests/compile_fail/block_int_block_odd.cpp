// An odd block.
// expect-gcc: BlockInt: the block size must be a positive even number (it is 63)
// expect-clang: headroom::diag::values<63>::hold<false>
// expect-clang: BlockInt: the block size must be a positive even number (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(BlockInt<8, 63>);
