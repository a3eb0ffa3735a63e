// OffloadParameters keeps the parameters in the offload tier, where the host
// updates them: the optimizer must be offloaded too.
// expect: Train<Model, OffloadParameters>: the parameters in the offload tier are updated there by the host, which needs the optimizer there too; add OffloadOptimizer
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>, OffloadParameters>;
constexpr auto p = plan<R>();
