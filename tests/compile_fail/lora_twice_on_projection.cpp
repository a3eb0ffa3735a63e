// Two Applys put an adapter on q_proj (rank 8, then rank 16 around it); a
// projection takes one adapter (PEFT's target_modules cannot say this).
// expect-gcc: Llama: the Apply<...>s put 2 LoRA adapters on q_proj; a projection takes at most one
// expect-clang: headroom::diag::values<2>::hold<false>
// expect-clang: Llama: the Apply<...>s put {} LoRA adapters on q_proj; a projection takes at most one
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<LoRA<8>, On<q_proj, v_proj>>, Apply<LoRA<16>, On<q_proj>>>;
using R = Train<M, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
