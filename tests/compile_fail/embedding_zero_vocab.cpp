// An empty vocabulary.
// expect-gcc: Embedding<Vocab, Dim>: dims must be positive (they are 0 and 64)
// expect-clang: headroom::diag::values<0, 64>::hold<false>
// expect-clang: Embedding<Vocab, Dim>: dims must be positive (they are {} and {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Embedding<0, 64>);
