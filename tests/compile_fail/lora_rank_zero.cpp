// LoRA with rank 0 is rejected with one sentence.
// expect: LoRA<Rank, L>: rank must be at least 1
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr auto n = sizeof(LoRA<0, Linear<64, 64>>);
