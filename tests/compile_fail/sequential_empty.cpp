// Sequential with no layer.
// expect: Sequential<Ls...>: needs at least one layer
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Sequential<>);
