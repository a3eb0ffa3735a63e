// Precision<BF16> on the host engine trains one process without offloading.
// expect: host::Trainer: Precision<BF16> and <F16> on the host engine train one process without offloading
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>, DataParallel<2>>;
constexpr auto n = sizeof(host::Trainer<R>);
