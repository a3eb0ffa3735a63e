// The offloaded update runs with data-parallel ranks, not yet with tensor-parallel ones.
// expect-gcc: Train<Model, OffloadOptimizer>: the offloaded update runs with DataParallel<N> ranks only for now, but this run has TensorParallel<2> and PipelineParallel<1>; drop OffloadOptimizer or them
// expect-clang: the offloaded update runs with DataParallel<N> ranks only for now, but this run has
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>, OffloadOptimizer, TensorParallel<2>>;
constexpr auto p = plan<R>();
