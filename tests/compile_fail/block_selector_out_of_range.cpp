// A block selector names a block the model does not have.
// expect: Llama: a block selector names block 7, but the model has 4 blocks (0 to 3)
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<Checkpointed<>, Blocks<1, 7>>>;
constexpr auto p = plan<Train<M, Batch<1>, Seq<16>>>();
