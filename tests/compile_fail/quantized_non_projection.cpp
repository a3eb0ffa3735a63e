// Quantized wraps linear projections only, not a norm.
// expect: Quantized<Q, L>: L must be a linear projection (Linear, or LoRA / Frozen over one)
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(Quantized<NF4, RMSNorm<64>>);
