// ZeRO shards over data-parallel ranks: one process has nothing to shard over.
// expect-gcc: Train<Model, ...>: ZeRO<2> shards model states over the data-parallel ranks, so it needs DataParallel<N> with N at least 2 (N is 1)
// expect-clang: shards model states over the data-parallel ranks, so it needs DataParallel<N> with N at least 2
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, ZeRO<2>>;
constexpr auto p = plan<R>();
