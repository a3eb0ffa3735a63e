// A run without Seq<T>.
// expect: Train<Model, ...>: give the sequence length exactly once, as Seq<T>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>>;
constexpr auto p = plan<R>();
