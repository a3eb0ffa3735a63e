// tiny_llama has 4 blocks: 3 stages cannot take equal shares.
// expect-gcc: Train<Model, PipelineParallel<3>>: each stage takes an equal share of the 4 blocks of the model, which do not divide by 3
// expect-clang: headroom::diag::values<3, 4, 3>::hold<false>
// expect-clang: each stage takes an equal share of the {} blocks of the model, which do not divide by {}
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<64>, Accumulate<4>, PipelineParallel<3>>;
constexpr auto p = plan<R>();
