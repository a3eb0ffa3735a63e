// GPT-2 has no q_proj (its attention input projection is the fused c_attn).
// expect-gcc: GPT2: Apply<Recipe, On<...>> names a projection GPT-2 does not have: q_proj (it has c_attn, c_proj, c_fc; attn_c_proj and mlp_c_proj pick one c_proj)
// expect-clang: headroom::diag::values<&headroom::q_proj::name>::hold<false>
// expect-clang: GPT2: Apply<Recipe, On<...>> names a projection GPT-2 does not have: {} (it has c_attn, c_proj, c_fc; attn_c_proj and mlp_c_proj pick one c_proj)
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<q_proj>>>;
using R = Train<M, Batch<1>, Seq<64>>;
constexpr auto p = plan<R>();
