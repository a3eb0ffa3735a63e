// LoRA with rank 0 is rejected with one sentence.
// expect-gcc: LoRA<Rank, L>: rank must be at least 1 (it is 0)
// expect-clang: headroom::diag::values<0>::hold<false>
// expect-clang: LoRA<Rank, L>: rank must be at least 1 (it is {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<0, Linear<64, 64>>);
