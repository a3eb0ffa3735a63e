// Linear<64, 32> feeds Linear<64, 64>: 32 != 64.
// expect: Sequential<Ls...>: each layer's out_features must equal the next layer's in_features
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Sequential<Linear<64, 32>, Linear<64, 64>>);
