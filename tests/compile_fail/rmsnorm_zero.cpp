// A norm over 0 features.
// expect-gcc: RMSNorm<D>: D must be positive (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: RMSNorm<D>: D must be positive (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(RMSNorm<0>);
