// An odd NF4 block.
// expect-gcc: NF4: the block size must be a positive even number (it is 63)
// expect-clang: headroom::diag::values<63>::hold<false>
// expect-clang: NF4: the block size must be a positive even number (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(NormalFloat4<63>);
