#pragma once
// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, as
// torch.optim.AdamW); two f32 moments per element. Element math:
// math/optim.hpp's adamw_update.
#include <cstdint>
#include <span>
#include <string_view>

#include "../core/bytes.hpp"
#include "../core/config.hpp"
#include "../host/kernels/optimizer.hpp"
#include "../math/optim.hpp"
#include "optimizer.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/optimizer.cuh"

namespace headroom::cuda {

// One block per chunk of 2048 elements.
template <class O, class S>
__global__ __launch_bounds__(optimizer_threads) void adamw_kernel(const ParamList list, const UpdateControl* __restrict__ control,
                                                                  bool clip) {
  const TensorEntry& e = list.find(blockIdx.x);
  if (optimizer_detail::update_stopped(control, e)) return;
  const math::AdamWStep<float> step = control->step_constants<math::AdamWStep<float>>();
  const float scale = clip ? control->grad_scale : 1.0f;
  S* weight = static_cast<S*>(e.weight);
  const S* grad = static_cast<const S*>(e.grad);
  float* m = reinterpret_cast<float*>(e.state + state_offset<O, 0>(e.n));
  float* v = reinterpret_cast<float*>(e.state + state_offset<O, 1>(e.n));
  const std::int64_t begin = (blockIdx.x - e.first_chunk) * optimizer_chunk;
  const std::int64_t end = begin + optimizer_chunk < e.n ? begin + optimizer_chunk : e.n;
  const bool vectorized = packs::all_aligned(weight, e.master, grad, m, v);
  optimizer_detail::chunk_elements(begin, end, vectorized, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float p[K], g[K], mi[K], vi[K];
    if (e.master != nullptr) packs::load(e.master + i, p);
    else packs::load(weight + i, p);
    packs::load(grad + i, g);
    packs::load(m + i, mi);
    packs::load(v + i, vi);
#pragma unroll
    for (int k = 0; k < K; ++k) math::adamw_update(p[k], mi[k], vi[k], g[k] * scale, step);
    if (e.master != nullptr) packs::store(e.master + i, p);
    packs::store(weight + i, p);
    packs::store(m + i, mi);
    packs::store(v + i, vi);
  });
}

}  // namespace headroom::cuda
#endif

namespace headroom {

template <class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<999, 1000>, class WeightDecay = Ratio<1, 100>>
struct AdamWith {
  using beta1 = Beta1;
  using beta2 = Beta2;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = "AdamW";
  // [m f32 x n][v f32 x n]
  static constexpr OptimDesc desc = OptimDesc::of(name, 2, "f32", {StateSection{4, 1}, StateSection{4, 1}});

  template <class C>
  using Step = math::AdamWStep<C>;
  template <class C>
  static Step<C> step(double lr, int step_no) {
    const math::AdamWHyper<C> h{static_cast<C>(lr), static_cast<C>(beta1::value), static_cast<C>(beta2::value), C(1e-8),
                                static_cast<C>(weight_decay::value)};
    return math::adamw_step(h, step_no);
  }

  template <class C>
  static void update(C* p, const C* g, const StateAt& state, std::int64_t n, const Step<C>& s, C grad_scale, const float*) {
    host::detail::adamw_range(p, g, state.section<float>(0), state.section<float>(1), 0, n, s, grad_scale);
  }

#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void update(std::span<const cuda::ParamRef> params, const cuda::UpdateControl* control, const float*, bool clip,
                     cudaStream_t stream, int first_position) {
    cuda::optimizer_detail::for_each_list(params, cuda::optimizer_chunk, first_position, [&](const cuda::ParamList& list, int) {
      cuda::launch(cuda::adamw_kernel<AdamWith, S>, "adamw_kernel", dim3(static_cast<unsigned>(list.chunks)),
                   dim3(cuda::optimizer_threads), stream, list, control, clip);
    });
  }
#endif
};

using AdamW = AdamWith<>;

}  // namespace headroom
