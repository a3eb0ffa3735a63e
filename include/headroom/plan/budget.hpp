#pragma once
// Budget checks that name both numbers when they fail:
//
//   static_assert(fits<MyRun, 24_GiB>);                  // plans MyRun (device tier)
//   static_assert(fits<MyRun, 64_GiB, Tier::offload>);   // the offload arena
//   static_assert(fits_budget<p.peak_bytes(), 24_GiB>);  // a plan you already have
//
// The first error line (core/diagnostic.hpp):
//   g++    ... 'headroom::compile_error<headroom::diag::text<80>{"fits<Run, Budget>: the
//          planned peak (6.81 GiB) exceeds the budget (6.00 GiB)"}>'
//   clang  static_assert failed due to requirement
//          '::headroom::diag::values<7307291136L, 6442450944L>::hold<false>'
//          "fits<Run, Budget>: the planned peak ({}) exceeds the budget ({})"
// GiB are 2^30 bytes, shown with two decimals (rounded half up); clang shows bytes.
#include "plan.hpp"

namespace headroom {

namespace detail {
template <bytes_t Peak, bytes_t Budget>
struct budget_check {
  HEADROOM_REQUIRE(Peak <= Budget, "fits<Run, Budget>: the planned peak ({}) exceeds the budget ({})", diag::gib{Peak},
                   diag::gib{Budget});
  static constexpr bool value = Peak <= Budget;
};
}  // namespace detail

// True when a planned peak is within the budget; a compile error naming both otherwise.
template <bytes_t Peak, bytes_t Budget>
inline constexpr bool fits_budget = detail::budget_check<Peak, Budget>::value;

// True when run R's arena of tier T fits the budget; a compile error naming both otherwise.
template <TrainingRun R, bytes_t Budget, Tier T = Tier::device>
inline constexpr bool fits = fits_budget<plan<R>().peak_bytes(T), Budget>;

}  // namespace headroom
