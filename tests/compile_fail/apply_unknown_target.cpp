// GPT-2 has no q_proj (its attention input projection is the fused c_attn).
// expect: GPT2: Apply<Recipe, On<...>> names a projection GPT-2 does not have
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<q_proj>>>;
using R = Train<M, Batch<1>, Seq<64>>;
constexpr auto p = plan<R>();
