// A LoRA dropout probability of 1 (everything dropped: 1 / (1 - p) is infinite).
// expect-gcc: LoRA<Rank, L, Alpha, Dropout>: the dropout probability must be at least 0 and below 1 (it is 1 / 1)
// expect-clang: headroom::diag::values<1, 1>::hold<false>
// expect-clang: LoRA<Rank, L, Alpha, Dropout>: the dropout probability must be at least 0 and below 1 (it is {} / {})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<8, Linear<64, 64>, Ratio<8>, Ratio<1, 1>>);
