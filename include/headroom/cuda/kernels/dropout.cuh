#pragma once
// Dropout on the CUDA engine (LoRA's lora_dropout): the counterparts of
// host::dropout_rows / dropout_backward_rows, with the masks of
// math/dropout.hpp, so both engines drop the same elements.
//
// The step number is read on the device, from the step's control block
// (UpdateControl::step), not passed by value: a captured step (CUDA graph)
// replays with each new step's number, and so with new masks. Step 0 is
// evaluation: nothing is dropped (the forward then copies x).
#include <cstdint>

#include "../../math/dropout.hpp"
#include "pointwise.cuh"

namespace headroom::cuda {

// What a kernel needs besides the step to rebuild an event's mask: the
// mask's threshold, scale and columns, and what its stream derives from.
struct DropoutSite {
  math::Dropout mask;  // (its stream is set by at())
  std::uint64_t seed = 0;
  int data_rank = 0, micro = 0, node = 0, instance = 0;

  HEADROOM_HOST_DEVICE math::Dropout at(int step) const {
    math::Dropout d = mask;
    d.stream = math::dropout_stream(math::dropout_step_key(seed, step, data_rank), micro, node, instance);
    return d;
  }
};

// xd (n, in) = dropout(x); a copy at step 0
template <class S, int W>
__global__ void dropout_rows_kernel(const S* __restrict__ x, S* __restrict__ xd, std::int64_t n, std::int64_t in,
                                    DropoutSite site, const std::int32_t* __restrict__ step) {
  const int s = *step;
  const math::Dropout d = site.at(s);
  packs::grid_stride<W>(n * in, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float v[K];
    packs::load(x + i, v);
    if (s != 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = d.apply(v[k], (i + k) / in, (i + k) % in);
    }
    packs::store(xd + i, v);
  });
}

// dx (n, in) (+)= dropout'(t): the same mask and scale (first: written)
template <class S, int W>
__global__ void dropout_backward_kernel(const S* __restrict__ t, S* __restrict__ dx, bool first, std::int64_t n,
                                        std::int64_t in, DropoutSite site, const std::int32_t* __restrict__ step) {
  const int s = *step;
  const math::Dropout d = site.at(s);
  packs::grid_stride<W>(n * in, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float g[K], old[K];
    packs::load(t + i, g);
#pragma unroll
    for (int k = 0; k < K; ++k) g[k] = s != 0 ? d.apply(g[k], (i + k) / in, (i + k) % in) : g[k];
    if (!first) {
      packs::load(dx + i, old);
#pragma unroll
      for (int k = 0; k < K; ++k) g[k] = old[k] + g[k];
    }
    packs::store(dx + i, g);
  });
}

// x, xd: (n, in); step: the device's step number (UpdateControl::step)
template <class S>
void dropout_rows(const S* x, S* xd, std::int64_t n, std::int64_t in, const DropoutSite& site, const std::int32_t* step,
                  cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n * in, packs::all_aligned(x, xd), [&](auto w, dim3 grid) {
    launch(dropout_rows_kernel<S, decltype(w)::value>, "dropout_rows_kernel", grid, dim3(packs::threads), stream, x, xd, n, in,
           site, step);
  });
}
// t, dx: (n, in)
template <class S>
void dropout_backward(const S* t, S* dx, bool first, std::int64_t n, std::int64_t in, const DropoutSite& site,
                      const std::int32_t* step, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n * in, packs::all_aligned(t, dx), [&](auto w, dim3 grid) {
    launch(dropout_backward_kernel<S, decltype(w)::value>, "dropout_backward_kernel", grid, dim3(packs::threads), stream, t, dx,
           first, n, in, site, step);
  });
}

}  // namespace headroom::cuda
