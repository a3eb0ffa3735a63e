// A Repeat inside a repeated block.
// expect: Repeat<N, Block>: Block must not contain another Repeat; write Repeat<N * M, Block>
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Repeat<2, Sequential<Repeat<2, Linear<64, 64>>>>);
