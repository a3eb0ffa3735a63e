// The MLP's activation slot takes Checkpointed<> only.
// expect: Llama: On<mlp_act> takes Checkpointed<> alone: the activation has no weights for another recipe to wrap
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::Llama<models::tiny_llama, Apply<LoRA<8>, On<mlp_act>>>;
constexpr auto p = plan<Train<M, Batch<1>, Seq<16>>>();
