// c_fc of 128 outputs in an MLP of 256.
// expect-gcc: MLP<D, F, ...>: c_fc must map D to F (64 to 256); it maps 64 to 128
// expect-clang: headroom::diag::values<64, 256, 64, 128>::hold<false>
// expect-clang: MLP<D, F, ...>: c_fc must map D to F ({} to {}); it maps {} to {}
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(MLP<64, 256, Linear<64, 128>, Linear<256, 64>>);
