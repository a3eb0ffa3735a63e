// `int` is not an option of Train.
// expect: Train<Model, Options...>: an option is not one of Batch, Seq, Precision, Accumulate, Workers, LossChunk, UpdateInBackward, OnCuda, OffloadOptimizer, OffloadParameters, DataParallel, ZeRO, TensorParallel, PipelineParallel or an optimizer
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, int>;
constexpr auto p = plan<R>();
