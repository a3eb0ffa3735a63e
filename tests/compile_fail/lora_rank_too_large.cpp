// A LoRA rank larger than the projection's in_features (32) is rejected.
// expect: LoRA<Rank, L>: rank must not exceed the projection's in_features or out_features
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<64, Linear<32, 128>>);
