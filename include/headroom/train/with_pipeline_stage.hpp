#pragma once
// Pipeline parallelism, for either engine: runs
// f.template operator()<pipeline_stage<R, s>>() for this process's stage s
// (process w of the run is stage w / (DataParallel x TensorParallel)), after
// checking that `world` has every process of the run. host:: and
// cuda::with_pipeline_stage check R at compile time and call it.
#include <string>
#include <utility>

#include "../run.hpp"

namespace headroom::trainers {

template <TrainingRun R, class Communicator, class F>
void with_pipeline_stage(Communicator& world, F&& f) {
  constexpr RunConfig c = R::config();
  world.check_size(c.world(), "ranks (" + std::to_string(c.pp) + " pipeline stages x " + std::to_string(c.dp) + " data-parallel x " +
                                  std::to_string(c.tp) + " tensor-parallel)");
  const int stage = world.rank() / (c.dp * c.tp);
  [&]<int... S>(std::integer_sequence<int, S...>) {
    ((S == stage ? (f.template operator()<pipeline_stage<R, S>>(), 0) : 0), ...);
  }(std::make_integer_sequence<int, c.pp>{});
}

}  // namespace headroom::trainers
