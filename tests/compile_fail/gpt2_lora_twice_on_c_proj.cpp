// c_proj names attn.c_proj and mlp.c_proj; attn_c_proj then names attn.c_proj
// again: two adapters on one projection.
// expect-gcc: GPT2: the Apply<...>s put 2 LoRA adapters on attn.c_proj; a projection takes at most one
// expect-clang: headroom::diag::values<2>::hold<false>
// expect-clang: GPT2: the Apply<...>s put {} LoRA adapters on attn.c_proj; a projection takes at most one
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<c_attn, c_proj>>, Apply<LoRA<4>, On<attn_c_proj>>>;
using R = Train<M, Batch<1>, Seq<64>>;
constexpr auto p = plan<R>();
