// Decoding runs f32 on the host: a bf16 run's weights go to an f32 run type first.
// expect: Generator<Run>: decoding runs f32 (or f64) on the host
#include <headroom/headroom.hpp>
#include <headroom/train/host/generator.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Precision<BF16>>;
constexpr auto n = sizeof(host::Generator<R, Context<32>, GenBatch<1>>);
