// NF4's block of 64 does not divide a row of 96 elements.
// expect: Quantized<Q, L>: the quantization block size of Q must divide the row length (in_features) of L
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Quantized<NF4, Linear<96, 64>>);
