#pragma once
// SGD with momentum (as torch.optim.SGD, dampening 0, not Nesterov): one f32
// momentum buffer per element, none when the momentum is zero. Element
// math: math/optim.hpp's sgd_update.
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

template <class O, class S>
__global__ __launch_bounds__(optimizer_threads) void sgd_kernel(const ParamList list, const UpdateControl* __restrict__ control,
                                                                bool clip) {
  const TensorEntry& e = list.find(blockIdx.x);
  if (optimizer_detail::update_stopped(control, e)) return;
  const math::SgdStep<float> step = control->step_constants<math::SgdStep<float>>();
  const float lr = step.lr, momentum = step.momentum, weight_decay = step.weight_decay;
  const float scale = clip ? control->grad_scale : 1.0f;
  S* weight = static_cast<S*>(e.weight);
  const S* grad = static_cast<const S*>(e.grad);
  float* buf = momentum != 0.0f ? reinterpret_cast<float*>(e.state + state_offset<O, 0>(e.n)) : nullptr;
  const std::int64_t begin = (blockIdx.x - e.first_chunk) * optimizer_chunk;
  const std::int64_t end = begin + optimizer_chunk < e.n ? begin + optimizer_chunk : e.n;
  const bool vectorized = packs::all_aligned(weight, e.master, grad, buf);
  optimizer_detail::chunk_elements(begin, end, vectorized, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float p[K], g[K], b[K];
    if (e.master != nullptr) packs::load(e.master + i, p);
    else packs::load(weight + i, p);
    packs::load(grad + i, g);
    if (buf != nullptr) packs::load(buf + i, b);
#pragma unroll
    for (int k = 0; k < K; ++k)
      math::sgd_update(p[k], buf != nullptr ? &b[k] : nullptr, g[k] * scale, lr, momentum, weight_decay);
    if (e.master != nullptr) packs::store(e.master + i, p);
    packs::store(weight + i, p);
    if (buf != nullptr) packs::store(buf + i, b);
  });
}

}  // namespace headroom::cuda
#endif

namespace headroom {

template <class Momentum = Ratio<9, 10>, class WeightDecay = Ratio<0>>
struct SGD {
  using momentum = Momentum;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = "SGD";
  // [momentum buffer f32 x n], or nothing
  static constexpr OptimDesc desc =
      Momentum::num != 0 ? OptimDesc::of(name, 1, "f32", {StateSection{4, 1}}) : OptimDesc::of(name, 0, "", {});

  template <class C>
  using Step = math::SgdStep<C>;
  template <class C>
  static Step<C> step(double lr, int) {
    return {static_cast<C>(lr), static_cast<C>(momentum::value), static_cast<C>(weight_decay::value)};
  }

  template <class C>
  static void update(C* p, const C* g, const StateAt& state, std::int64_t n, const Step<C>& s, C grad_scale, const float*) {
    host::detail::sgd_range(p, g, desc.sections > 0 ? state.section<float>(0) : nullptr, 0, n, s, grad_scale);
  }

#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void update(std::span<const cuda::ParamRef> params, const cuda::UpdateControl* control, const float*, bool clip,
                     cudaStream_t stream, int first_position) {
    cuda::optimizer_detail::for_each_list(params, cuda::optimizer_chunk, first_position, [&](const cuda::ParamList& list, int) {
      cuda::launch(cuda::sgd_kernel<SGD, S>, "sgd_kernel", dim3(static_cast<unsigned>(list.chunks)), dim3(cuda::optimizer_threads),
                   stream, list, control, clip);
    });
  }
#endif
};

}  // namespace headroom
