// OffloadOptimizer updates each parameter on the host as soon as its gradient
// reaches the offload tier: UpdateInBackward would update it a second time.
// (g++ shows the apostrophe escaped)
// expect-gcc: Train<Model, OffloadOptimizer>: the host already updates each parameter as soon as its gradient reaches the offload tier, so UpdateInBackward (the device\'s update inside backward) has nothing to do; drop it
// expect-clang: Train<Model, OffloadOptimizer>: the host already updates each parameter as soon as its gradient reaches the offload tier, so UpdateInBackward (the device's update inside backward) has nothing to do; drop it
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>, OffloadOptimizer, UpdateInBackward>;
constexpr auto p = plan<R>();
