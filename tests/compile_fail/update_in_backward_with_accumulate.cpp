// UpdateInBackward frees grads in backward, so it cannot accumulate micro-batches.
// expect: Train<Model, ...>: UpdateInBackward frees each layer's grads right after its update, so it needs Accumulate<1>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, UpdateInBackward, Accumulate<2>>;
constexpr auto p = plan<R>();
