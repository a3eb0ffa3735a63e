// Two optimizers.
// expect: Train<Model, ...>: give at most one optimizer
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Seq<16>, AdamW, SGD<>>;
constexpr auto p = plan<R>();
