// GPT-2's context is 1024 positions.
// expect-gcc: Train<Model, Seq<T>>: T (2048) exceeds the context length of the model (1024)
// expect-clang: headroom::diag::values<2048, 1024>::hold<false>
// expect-clang: Train<Model, Seq<T>>: T ({}) exceeds the context length of the model ({})
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::GPT2<models::gpt2_124m>, Batch<1>, Seq<2048>>;
constexpr auto p = plan<R>();
