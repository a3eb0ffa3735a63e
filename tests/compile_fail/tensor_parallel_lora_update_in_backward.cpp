// LoRA under tensor parallelism sums each whole adapter matrix's partial
// gradients after the backward, so it cannot update inside the backward.
// expect-gcc: Train<Model, TensorParallel<2>>: UpdateInBackward updates each parameter inside its backward, but each of the 2 ranks holds a partial gradient of a LoRA adapter matrix
// expect-clang: UpdateInBackward updates each parameter inside its backward, but each of the {} ranks holds a partial gradient
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, v_proj>>>, Batch<1>, Seq<64>, UpdateInBackward,
                TensorParallel<2>>;
constexpr auto p = plan<R>();
