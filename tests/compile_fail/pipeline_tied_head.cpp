// GPT-2 ties its LM head to the embedding: the first stage holds one, the last the other.
// expect-gcc: Train<Model, PipelineParallel<2>>: the LM head is tied to the embedding, which the first stage holds and the last does not; tied weights are not shared between stages yet
// expect-clang: the LM head is tied to the embedding, which the first stage holds and the last does not
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::GPT2<models::gpt2_124m>, Batch<1>, Seq<64>, Accumulate<4>, PipelineParallel<2>>;
constexpr auto p = plan<R>();
