// Linear<64, 32> feeds Linear<64, 64>: 32 != 64.
// expect-gcc: Sequential<Ls...>: the out_features of each layer must equal the in_features of the next (layer 0 gives 32, layer 1 takes 64)
// expect-clang: headroom::diag::values<0, 32, 1, 64>::hold<false>
// expect-clang: Sequential<Ls...>: the out_features of each layer must equal the in_features of the next (layer {} gives {}, layer {} takes {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Sequential<Linear<64, 32>, Linear<64, 64>>);
