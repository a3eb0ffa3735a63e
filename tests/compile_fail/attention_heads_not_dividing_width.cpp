// Attention used directly with 5 heads over a width of 64.
// expect-gcc: Attention<D, Heads, ...>: the number of heads (5) must divide the model width D (64)
// expect-clang: headroom::diag::values<5, 64>::hold<false>
// expect-clang: Attention<D, Heads, ...>: the number of heads ({}) must divide the model width D ({})
#include <headroom/headroom.hpp>
using namespace headroom;

using A = Attention<64, 5, 5, Positions::rope, Linear<64, 60>, Linear<64, 60>, Linear<64, 60>, Linear<60, 64>>;
constexpr auto n = sizeof(A);
