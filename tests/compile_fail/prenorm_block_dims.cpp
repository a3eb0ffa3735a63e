// The second norm of a block has the wrong width.
// expect-gcc: PreNormBlock: norms, attention and MLP must all map D features to D features (D = 64: norm1 takes 64, attention gives 64, norm2 takes 32, MLP maps 64 to 64)
// expect-clang: headroom::diag::values<64, 64, 64, 32, 64, 64>::hold<false>
// expect-clang: PreNormBlock: norms, attention and MLP must all map D features to D features (D = {}: norm1 takes {}, attention gives {}, norm2 takes {}, MLP maps {} to {})
#include <headroom/headroom.hpp>
using namespace headroom;

using A = Attention<64, 4, 4, Positions::rope, Linear<64, 64>, Linear<64, 64>, Linear<64, 64>, Linear<64, 64>>;
using Mlp = SwiGLU<64, 256, Linear<64, 256>, Linear<64, 256>, Linear<256, 64>>;
constexpr auto n = sizeof(PreNormBlock<LlamaBlockNames, RMSNorm<64>, A, RMSNorm<32>, Mlp>);
