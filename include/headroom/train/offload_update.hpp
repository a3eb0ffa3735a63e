#pragma once
// OffloadOptimizer (ZeRO-Offload) on either engine: the updates that run
// while the backward still runs.
//
// Each gradient goes to the offload tier after the step that completes it
// (its collective, with data parallelism); in a step's last micro-batch the
// engine then hands the parameter to its update thread, which sums the
// gradient's squares and, when nothing needs every gradient first, checks
// and updates the parameter at once, on the CPU, from the offload tier: the
// update of the later layers overlaps the backward of the earlier ones.
// From the first gradient that fails no update runs (GradientCheck::
// complete). Clipping (the norm needs every gradient), loss scaling (an
// overflow anywhere skips the whole step) and several processes (each must
// know that every gradient is finite before any update, and some gradients
// are summed over processes first) make the updates wait for the backward;
// the engine then updates every parameter after it, with the global norm.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "gradient_check.hpp"

namespace headroom::trainers {

struct UpdatesInFlight {
  // Whether a step's updates run as their gradients reach the offload tier.
  static bool possible(const TrainOptions& o, bool one_process, bool scales_loss) {
    return o.clip_norm <= 0 && one_process && !scales_loss;
  }

  explicit UpdatesInFlight(std::size_t params) : squares(params, 0.0) {}

  // The start of a step (no allocation).
  void begin_step() {
    std::fill(squares.begin(), squares.end(), 0.0);
    checked = GradientCheck{};
  }

  // On the update thread: parameter k's gradient, whose squares sum to sq,
  // is in the offload tier; with `in_flight` it is checked and updated now
  // (update()). `stopped`: the step stops anyway (its loss is not finite).
  template <class Update, class Find>
  void offloaded(int k, double sq, bool in_flight, Update&& update, Find&& find, bool stopped = false) {
    squares[static_cast<std::size_t>(k)] = sq;
    if (in_flight) checked.complete(k, sq, update, find, stopped);
  }

  // After the backward, when the updates ran in flight: the step's global
  // gradient norm (the squares summed in schedule order); throws
  // non_finite_gradient, saying what was updated, when a gradient failed.
  template <class Plan, class Sched>
  double norm(const Plan& plan, const Sched& sched, int step_no) const {
    double sq = 0;
    for (std::size_t k = 0; k < sched.params.size(); ++k)
      if (sched.params[k].trainable) sq += squares[k];
    if (checked.first >= 0) checked.throw_skipped_updates(plan, sched, step_no, "OffloadOptimizer without clipping");
    return std::sqrt(sq);
  }

  std::vector<double> squares;  // per parameter: its gradient's squares, summed in schedule order
  GradientCheck checked;        // the updates in flight: what they found
};

}  // namespace headroom::trainers
