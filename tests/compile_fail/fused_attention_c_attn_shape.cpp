// c_attn must produce q, k and v (3 D).
// expect-gcc: FusedAttention: c_attn must map D to 3 D (64 to 192); it maps 64 to 128
// expect-clang: headroom::diag::values<64, 192, 64, 128>::hold<false>
// expect-clang: FusedAttention: c_attn must map D to 3 D ({} to {}); it maps {} to {}
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(FusedAttention<64, 4, Linear<64, 128>, Linear<64, 64>>);
