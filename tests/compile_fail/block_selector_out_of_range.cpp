// A block selector names a block the model does not have.
// expect-gcc: Llama: a block selector names block 7, but the model has 4 blocks (0 to 3)
// expect-clang: headroom::diag::values<7, 4, 3>::hold<false>
// expect-clang: Llama: a block selector names block {}, but the model has {} blocks (0 to {})
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<Checkpointed<>, Blocks<1, 7>>>;
constexpr auto p = plan<Train<M, Batch<1>, Seq<16>>>();
