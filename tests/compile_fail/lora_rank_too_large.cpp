// A LoRA rank larger than the projection's in_features (32) is rejected.
// expect-gcc: LoRA<Rank, L>: rank (64) must not exceed in_features (32) or out_features (128) of the projection
// expect-clang: headroom::diag::values<64, 32, 128>::hold<false>
// expect-clang: LoRA<Rank, L>: rank ({}) must not exceed in_features ({}) or out_features ({}) of the projection
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<64, Linear<32, 128>>);
