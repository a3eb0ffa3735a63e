// The offloaded update runs on one process: no data-parallel ranks yet.
// expect-gcc: Train<Model, OffloadOptimizer>: the offloaded update runs on one process for now, but this run has 2 processes (PipelineParallel x DataParallel x TensorParallel); drop OffloadOptimizer or the parallel layout
// expect-clang: the offloaded update runs on one process for now, but this run has
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>, OffloadOptimizer, DataParallel<2>>;
constexpr auto p = plan<R>();
