#pragma once
// Work splitting for the host engine: one OpenMP team of `workers` threads
// per kernel, each thread owning a fixed, contiguous share of the work (and
// its private scratch tile). Static shares make results depend only on the
// worker count, never on timing. Without OpenMP everything runs on the
// calling thread.
#include <cstdint>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace headroom::host {

// [begin, end) of worker w's share of n items split over `workers`.
struct Range {
  std::int64_t begin = 0, end = 0;
  constexpr std::int64_t size() const { return end - begin; }
};
constexpr Range share(std::int64_t n, int workers, int w) {
  const std::int64_t base = n / workers, extra = n % workers;
  const std::int64_t begin = w * base + (w < extra ? w : extra);
  return Range{begin, begin + base + (w < extra ? 1 : 0)};
}

// Runs f(worker, workers) on a team of at most `workers` threads.
template <class F>
void team([[maybe_unused]] int workers, F&& f) {
#ifdef _OPENMP
  if (workers > 1) {
#pragma omp parallel num_threads(workers)
    f(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  f(0, 1);
}

// Runs f(i, worker) for i in [0, n), each worker taking one contiguous share.
template <class F>
void parallel_for(std::int64_t n, int workers, F&& f) {
  team(workers, [&](int w, int count) {
    const Range r = share(n, count, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) f(i, w);
  });
}

}  // namespace headroom::host
