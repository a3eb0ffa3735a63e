// A model type that is not a Layer.
// expect: Train<Model, ...>: Model must satisfy the Layer concept (see layers/layer.hpp)
#include <headroom/headroom.hpp>
using namespace headroom;

struct NotALayer {};
using R = Train<NotALayer, Seq<16>>;
constexpr auto n = sizeof(R);
