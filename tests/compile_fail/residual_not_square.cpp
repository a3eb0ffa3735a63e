// A residual branch must keep the width.
// expect-gcc: Residual<F>: F must map D features to D features (it maps 64 to 32)
// expect-clang: headroom::diag::values<64, 32>::hold<false>
// expect-clang: Residual<F>: F must map D features to D features (it maps {} to {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Residual<Linear<64, 32>>);
