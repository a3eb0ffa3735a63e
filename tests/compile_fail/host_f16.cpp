// f16 storage is the CUDA engine's; the host runs f32, bf16 or f64.
// expect: host::Trainer<Run>: the host engine runs Precision<F32>, Precision<BF16> or Precision<F64>
#include <headroom/headroom.hpp>
#include <headroom/host/trainer.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<F16>>;
constexpr auto n = sizeof(host::Trainer<R>);
