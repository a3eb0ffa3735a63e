// LoRA adapts linear projections only, not a norm.
// expect: LoRA<Rank, L>: L must be a linear projection (Linear, or Quantized / Frozen over one)
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<8, RMSNorm<64>>);
