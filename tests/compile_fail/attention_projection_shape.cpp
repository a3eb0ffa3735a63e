// q_proj of 60 outputs where 4 heads of 16 need 64.
// expect-gcc: Attention: q_proj must map D to Heads * head_dim (64 to 64); it maps 64 to 60
// expect-clang: headroom::diag::values<64, 64, 64, 60>::hold<false>
// expect-clang: Attention: q_proj must map D to Heads * head_dim ({} to {}); it maps {} to {}
#include <headroom/headroom.hpp>
using namespace headroom;

using A = Attention<64, 4, 4, Positions::rope, Linear<64, 60>, Linear<64, 64>, Linear<64, 64>, Linear<64, 64>>;
constexpr auto n = sizeof(A);
