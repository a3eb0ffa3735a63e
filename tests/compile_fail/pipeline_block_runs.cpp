// Pipeline stages divide one Repeat of identical blocks; selected blocks make several.
// expect-gcc: the block selectors of the model (Blocks, EveryKth, FirstBlocks) make its blocks 4 runs of differing blocks
// expect-clang: headroom::diag::values<2, 4>::hold<false>
// expect-clang: the block selectors of the model (Blocks, EveryKth, FirstBlocks) make its blocks {} runs of differing blocks
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<Checkpointed<>, EveryKth<2>>>;
constexpr auto p = plan<Train<M, Batch<1>, Seq<16>, PipelineParallel<2>, Accumulate<2>>>();
