// A modifier that is not an Apply.
// expect: GPT2<Config, Mods...>: every modifier must be an Apply<Recipe, On<...>> or Apply<Policy, EveryBlock>
#include <headroom/headroom.hpp>
using namespace headroom;

using M = models::GPT2<models::gpt2_124m, LoRA<8>>;
constexpr auto n = sizeof(M);
