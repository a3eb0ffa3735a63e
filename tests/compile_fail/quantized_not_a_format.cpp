// int is not a quantization format.
// expect: Quantized<Q, L>: Q must be a quantization format (NF4, NF4DQ, Int8, Int4, LLMInt8<>)
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Quantized<int, Linear<64, 64>>);
