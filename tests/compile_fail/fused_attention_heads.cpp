// FusedAttention with 5 heads over a width of 64.
// expect-gcc: FusedAttention<D, Heads, ...>: the number of heads (5) must divide the model width D (64)
// expect-clang: headroom::diag::values<5, 64>::hold<false>
// expect-clang: FusedAttention<D, Heads, ...>: the number of heads ({}) must divide the model width D ({})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(FusedAttention<64, 5, Linear<64, 192>, Linear<64, 64>>);
