// GPT-2's context is 1024 positions.
// expect: Train<Model, Seq<T>>: T exceeds the model's context length
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::GPT2<models::gpt2_124m>, Batch<1>, Seq<2048>>;
constexpr auto p = plan<R>();
