// Llama has no c_attn (that is GPT-2's fused projection).
// expect-gcc: Llama: Apply<Recipe, On<...>> names a projection Llama does not have: c_attn (it has q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)
// expect-clang: headroom::diag::values<&headroom::c_attn::name>::hold<false>
// expect-clang: Llama: Apply<Recipe, On<...>> names a projection Llama does not have: {} (it has q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, c_attn>>>;
using R = Train<M, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
