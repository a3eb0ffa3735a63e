// Offloaded on one projection inside the repeated block; it must wrap the whole block.
// expect: Repeat<N, Block>: Offloaded<L> inside a repeated block must wrap the whole block (Apply<Offloaded<>, EveryBlock>)
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<Offloaded<>, On<q_proj>>>;
using R = Train<M, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
