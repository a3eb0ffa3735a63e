// Workers<0>.
// expect-gcc: Workers<W>: W must be at least 1 (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: Workers<W>: W must be at least 1 (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Workers<0>);
