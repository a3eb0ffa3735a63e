// NF4's block of 64 does not divide a row of 96 elements.
// expect-gcc: Quantized<Q, L>: the quantization block size of Q (64) must divide the row length (in_features) of L (96)
// expect-clang: headroom::diag::values<64, 96>::hold<false>
// expect-clang: Quantized<Q, L>: the quantization block size of Q ({}) must divide the row length (in_features) of L ({})
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Quantized<NF4, Linear<96, 64>>);
