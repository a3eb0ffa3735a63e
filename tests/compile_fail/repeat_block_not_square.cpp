// A repeated block must keep the width.
// expect-gcc: Repeat<N, Block>: Block must map D features to D features (it maps 64 to 32)
// expect-clang: headroom::diag::values<64, 32>::hold<false>
// expect-clang: Repeat<N, Block>: Block must map D features to D features (it maps {} to {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Repeat<4, Linear<64, 32>>);
