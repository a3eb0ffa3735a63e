// A negative dimension.
// expect-gcc: Linear<In, Out>: dims must be positive (they are -1 and 8)
// expect-clang: headroom::diag::values<-1, 8>::hold<false>
// expect-clang: Linear<In, Out>: dims must be positive (they are {} and {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Linear<-1, 8>);
