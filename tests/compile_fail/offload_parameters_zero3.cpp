// ZeRO 3 gathers the parameters from the ranks' shards on the device; shards in the offload tier are not fetched there yet.
// expect-gcc: Train<Model, OffloadParameters>: ZeRO<3> gathers each layer
// expect-clang: and stored in the offload tier they are not fetched there yet; use ZeRO<2> or less
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OffloadOptimizer, OffloadParameters, DataParallel<2>, ZeRO<3>>;
constexpr auto p = plan<R>();
