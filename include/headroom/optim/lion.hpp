#pragma once
// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
// arXiv:2302.06675): the update is the sign of an interpolation between the
// momentum and the gradient, so every element moves by exactly lr; one f32
// momentum per element (half of AdamW's state). Decoupled weight decay as in
// the paper (p <- p (1 - lr wd)); the paper's defaults beta1 0.9, beta2
// 0.99, and a learning rate 3-10x smaller than AdamW's. Element math:
// math/optim.hpp's lion_update.
//
// The whole optimizer is this header: its state layout (the plan sizes it,
// io saves it), its range update for the host engine (and for the CUDA
// engine's CPU update under OffloadOptimizer), and its CUDA kernel.
#include <cstdint>
#include <span>
#include <string_view>

#include "../core/bytes.hpp"
#include "../core/config.hpp"
#include "../math/optim.hpp"
#include "optimizer.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/optimizer.cuh"

namespace headroom::cuda {

// One block per chunk of 2048 elements.
template <class O, class S>
__global__ __launch_bounds__(optimizer_threads) void lion_kernel(const ParamList list, const UpdateControl* __restrict__ control,
                                                                 bool clip) {
  const TensorEntry& e = list.find(blockIdx.x);
  if (optimizer_detail::update_stopped(control, e)) return;
  const math::LionStep<float> step = control->step_constants<math::LionStep<float>>();
  const float scale = clip ? control->grad_scale : 1.0f;
  S* weight = static_cast<S*>(e.weight);
  const S* grad = static_cast<const S*>(e.grad);
  float* m = reinterpret_cast<float*>(e.state + state_offset<O, 0>(e.n));
  const std::int64_t begin = (blockIdx.x - e.first_chunk) * optimizer_chunk;
  const std::int64_t end = begin + optimizer_chunk < e.n ? begin + optimizer_chunk : e.n;
  const bool vectorized = packs::all_aligned(weight, e.master, grad, m);
  optimizer_detail::chunk_elements(begin, end, vectorized, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float p[K], g[K], mi[K];
    if (e.master != nullptr) packs::load(e.master + i, p);
    else packs::load(weight + i, p);
    packs::load(grad + i, g);
    packs::load(m + i, mi);
#pragma unroll
    for (int k = 0; k < K; ++k) math::lion_update(p[k], mi[k], g[k] * scale, step);
    if (e.master != nullptr) packs::store(e.master + i, p);
    packs::store(weight + i, p);
    packs::store(m + i, mi);
  });
}

}  // namespace headroom::cuda
#endif

namespace headroom {

template <class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<99, 100>, class WeightDecay = Ratio<0>>
struct LionWith {
  using beta1 = Beta1;
  using beta2 = Beta2;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = "Lion";
  // [m f32 x n]
  static constexpr OptimDesc desc = OptimDesc::of(name, 1, "f32", {StateSection{4, 1}});

  template <class C>
  using Step = math::LionStep<C>;
  template <class C>
  static Step<C> step(double lr, int) {
    return {static_cast<C>(lr), static_cast<C>(beta1::value), static_cast<C>(beta2::value), static_cast<C>(weight_decay::value)};
  }

  // elements [0, n) of a range, on the calling thread
  template <class C>
  static void update(C* p, const C* g, const StateAt& state, std::int64_t n, const Step<C>& s, C grad_scale, const float*) {
    float* m = state.section<float>(0);
    for (std::int64_t i = 0; i < n; ++i) {
      C mi = m[i];
      math::lion_update(p[i], mi, g[i] * grad_scale, s);
      m[i] = static_cast<float>(mi);
    }
  }

#if HEADROOM_CUDA_KERNELS
  // one pass over params, its Step<float> read from the control block
  template <class S>
  static void update(std::span<const cuda::ParamRef> params, const cuda::UpdateControl* control, const float*, bool clip,
                     cudaStream_t stream, int first_position) {
    cuda::optimizer_detail::for_each_list(params, cuda::optimizer_chunk, first_position, [&](const cuda::ParamList& list, int) {
      cuda::launch(cuda::lion_kernel<LionWith, S>, "lion_kernel", dim3(static_cast<unsigned>(list.chunks)),
                   dim3(cuda::optimizer_threads), stream, list, control, clip);
    });
  }
#endif
};

using Lion = LionWith<>;

}  // namespace headroom
