// Batch given twice.
// expect: Train<Model, ...>: each option may be given at most once
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Batch<2>>;
constexpr auto p = plan<R>();
