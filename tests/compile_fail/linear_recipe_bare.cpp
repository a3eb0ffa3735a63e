// Linear<> (a recipe, dims still open) used as a layer of its own, in a
// user's model.
// expect: Linear<>: a recipe without dims is only valid inside a model's Apply<...>; write Linear<In, Out>
#include <headroom/headroom.hpp>
using namespace headroom;

using Net = Sequential<Linear<>>;
using R = Train<Net, Batch<1>, Seq<16>>;
constexpr auto p = plan<R>();
