#pragma once
// What pipeline parallelism needs of a model, checked at compile time
// (run.hpp): PipelineParallel<S> divides the blocks of the model's Repeat
// (layers/repeat.hpp builds a stage's share) into S equal shares, so the
// model must have a Repeat whose count S divides; the layers before it go
// to the first stage and those after it to the last. An LM head tied to the
// embedding table then runs on another stage than the table: the model
// declares a copy of the table on the last stage (Builder::declare), both
// copies start from the same values (keyed by the same path), and the
// engines sum the two gradients before the update (graph::Param::
// stage_shared), so the copies stay equal, as Megatron-LM keeps its
// first and last stages' word embeddings. Offloaded blocks keep one host
// copy of their activations per micro-batch in flight (plan.hpp: the
// offload tier's saved activations get copies like the device's).
#include <cstdint>
#include <string_view>

#include "layer.hpp"

namespace headroom::pipeline_stages {

struct Issue {
  enum Kind : int { none, no_repeat, uneven, runs } kind = none;
  std::int64_t blocks = 0;  // the Repeat's count (runs: how many Repeats the model's blocks are)
};

namespace detail {
struct Found {
  std::int64_t repeat = -1;  // the first Repeat's count, -1: none
  int repeats = 0;           // Repeats found (several: a model whose block selectors make runs of blocks)
  bool tied = false;
};
template <class L>
constexpr void find(Found& f);
template <class... Ls>
constexpr void find_all(Found& f, type_list<Ls...>) {
  (find<Ls>(f), ...);
}
template <class L>
constexpr void find(Found& f) {
  if constexpr (L::kind == std::string_view("Repeat")) {
    if (f.repeat < 0) f.repeat = L::count;
    ++f.repeats;
  } else if constexpr (L::kind == std::string_view("LMHeadLoss")) {
    f.tied = f.tied || L::tied;
  }
  find_all(f, typename L::children{});
}
}  // namespace detail

template <class M>
constexpr Issue issue(int stages) {
  if (stages <= 1) return {};
  detail::Found f;
  detail::find<M>(f);
  if (f.repeat < 0) return {Issue::no_repeat, 0};
  if (f.repeats > 1) return {Issue::runs, f.repeats};
  if (f.repeat % stages != 0) return {Issue::uneven, f.repeat};
  return {Issue::none, f.repeat};
}

// Whether M's LM head is tied to its embedding table.
template <class M>
constexpr bool tied_head() {
  detail::Found f;
  detail::find<M>(f);
  return f.tied;
}

}  // namespace headroom::pipeline_stages
