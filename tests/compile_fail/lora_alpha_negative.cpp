// A negative LoRA alpha.
// expect-gcc: LoRA<Rank, L, Alpha>: alpha must be positive (it is -1 / 2)
// expect-clang: headroom::diag::values<-1, 2>::hold<false>
// expect-clang: LoRA<Rank, L, Alpha>: alpha must be positive (it is {} / {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<8, Linear<64, 64>, Ratio<-1, 2>>);
