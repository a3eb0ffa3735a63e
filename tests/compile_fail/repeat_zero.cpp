// Zero repetitions.
// expect-gcc: Repeat<N, Block>: N must be at least 1 (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: Repeat<N, Block>: N must be at least 1 (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Repeat<0, Linear<64, 64>>);
