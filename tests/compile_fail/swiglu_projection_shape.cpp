// down_proj reading 128 features in a SwiGLU of 256.
// expect-gcc: SwiGLU<D, F, ...>: down_proj must map F to D (256 to 64); it maps 128 to 64
// expect-clang: headroom::diag::values<256, 64, 128, 64>::hold<false>
// expect-clang: SwiGLU<D, F, ...>: down_proj must map F to D ({} to {}); it maps {} to {}
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(SwiGLU<64, 256, Linear<64, 256>, Linear<64, 256>, Linear<128, 64>>);
