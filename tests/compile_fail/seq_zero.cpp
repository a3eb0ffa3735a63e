// Seq<0>.
// expect-gcc: Seq<T>: T must be at least 1 (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: Seq<T>: T must be at least 1 (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Seq<0>);
