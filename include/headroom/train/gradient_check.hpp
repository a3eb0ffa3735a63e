#pragma once
// The gradient check of a step and the errors it reports, for both engines'
// trainers (docs/training.md, "What is guaranteed on a NaN").
//
// A gradient stops the step when its squares do not sum to a finite number
// within f32's range: a NaN or an infinity in it, or values so large
// (|g| > 1.8e19) that AdamW's f32 second moment would overflow. The norm's
// pass is the check; only on the failure path are gradients searched, to
// name the parameter: the first in schedule order with a NaN or an
// infinity, else the first whose own squares leave f32's range, else the
// largest. Where parameters are updated as their gradients complete
// (UpdateInBackward; OffloadOptimizer without clipping) each checks its
// own first, and from the first that fails none is updated.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "common.hpp"

namespace headroom::trainers {

inline std::string short_number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", x);
  return b;
}

// What is wrong with parameter p's gradient: its element `element`
// (row-major) is `value`, or (element < 0) the squares of its elements (own)
// or of the step's gradients sum to `value`, beyond f32's range.
template <class Param>
std::string describe_bad_gradient(const Param& p, std::int64_t element, double value, bool own, double max_squares) {
  if (element >= 0)
    return "its element [" + std::to_string(element / p.cols) + ", " + std::to_string(element % p.cols) + "] of (" +
           std::to_string(p.rows) + ", " + std::to_string(p.cols) + ") is " + short_number(value);
  return std::string(own ? "its elements are finite, but their squares sum to "
                         : "every element is finite, but the squares of the step's gradients (this one the largest) sum to ") +
         short_number(value) + ", beyond f32's range (" + short_number(max_squares) + ")";
}

// The end of the message of a step stopped before any update.
inline std::string nothing_updated(int step_no) {
  return "nothing was updated: the weights and the optimizer state are those of step " + std::to_string(step_no - 1) +
         " and the step count stays " + std::to_string(step_no - 1);
}

// A parameter's first NaN or infinite gradient element: its row-major index
// in the whole parameter (-1: every element is finite) and its value.
struct BadElement {
  std::int64_t index = -1;
  double value = 0;
};

// What a step's check has found so far.
struct GradientCheck {
  static constexpr double max_squares = std::numeric_limits<float>::max();

  double squares = 0;            // checked as they completed: the squares of the gradients used
  int first = -1;                // sched.params index of the parameter the error names; -1: none failed
  std::int64_t element = -1;     // its first NaN or infinite element; -1: all finite, the squares overflow f32
  double value = 0;              // that element, or the sum of squares that overflows
  bool own = true;               // the sum is this parameter's own (else the step's)
  int first_in_backward = -1;    // checked as they completed: the first that failed, in update order
  int updated = 0, skipped = 0;  // checked as they completed: updates run and not run

  // Whether parameter k's gradient, whose squares sum to sq, stops the step.
  // The one the error will name is kept (its gradient buffer may be reused
  // later): a NaN or an infinity before an overflow, then the lower schedule
  // index. find(k) searches k's gradient (BadElement), on this path only.
  template <class Find>
  bool flag(int k, double sq, Find&& find) {
    if (sq <= max_squares) return false;
    const BadElement bad = find(k);
    const bool non_finite = bad.index >= 0, named_non_finite = element >= 0;
    if (first < 0 || (non_finite && !named_non_finite) || (non_finite == named_non_finite && k < first)) {
      first = k;
      element = bad.index;
      value = non_finite ? bad.value : sq;
      own = true;
    }
    return true;
  }

  // Parameter k's gradient is complete in the backward (squares sq): it is
  // updated at once (update()) while no gradient of the step has failed;
  // from the first that fails none is. `stopped`: the step stops anyway (its
  // loss is not finite), so nothing is updated or named.
  template <class Update, class Find>
  void complete(int k, double sq, Update&& update, Find&& find, bool stopped = false) {
    if (!stopped && first < 0 && sq <= max_squares) {
      squares += sq;
      update();
      ++updated;
      return;
    }
    if (!stopped && flag(k, sq, find) && first_in_backward < 0) first_in_backward = k;
    ++skipped;
  }

  template <class Sched>
  std::string describe(const Sched& sched) const {
    return describe_bad_gradient(sched.params[static_cast<std::size_t>(first)], element, value, own, max_squares);
  }

  // After a backward whose updates ran as their gradients completed (`how`:
  // "UpdateInBackward", "OffloadOptimizer without clipping") and one failed:
  // which were updated and which not.
  template <class Plan, class Sched>
  [[noreturn]] void throw_skipped_updates(const Plan& plan, const Sched& sched, int step_no, std::string_view how) const {
    throw non_finite_gradient(
        step_no, path_of(plan, sched.params[static_cast<std::size_t>(first)]),
        describe(sched) + "; " + std::string(how) + ": the " + std::to_string(updated) +
            " parameters whose gradients were complete and checked before the first that failed in backward order (" +
            path_of(plan, sched.params[static_cast<std::size_t>(first_in_backward)]) + ") keep their update, the other " +
            std::to_string(skipped) +
            " were not updated; no non-finite gradient reached a weight or an optimizer state, and the step count stays " +
            std::to_string(step_no - 1));
  }

  // Before any update: the squares of the step's gradients sum to `total`,
  // out of range. Checks every trainable parameter (squares_of(k): its
  // squares as the norm counts them) and throws, naming the first in
  // schedule order with a NaN or an infinity, else the first whose own
  // squares leave f32's range, else the largest.
  template <class Plan, class Sched, class Squares, class Find>
  [[noreturn]] static void stop_before_update(const Plan& plan, const Sched& sched, int step_no, double total, Squares&& squares_of,
                                              Find&& find) {
    GradientCheck c;
    int largest = -1;
    double largest_sq = -1;
    for (std::size_t k = 0; k < sched.params.size(); ++k) {
      if (!sched.params[k].trainable) continue;
      const double sq = squares_of(static_cast<int>(k));
      c.flag(static_cast<int>(k), sq, find);
      if (sq > largest_sq) largest = static_cast<int>(k), largest_sq = sq;
    }
    if (c.first < 0) c = GradientCheck{.first = largest, .element = -1, .value = total, .own = false};
    throw non_finite_gradient(step_no, path_of(plan, sched.params[static_cast<std::size_t>(c.first)]),
                              c.describe(sched) + " (the global gradient norm is " + short_number(std::sqrt(total)) + "); " +
                                  nothing_updated(step_no));
  }
};

}  // namespace headroom::trainers
