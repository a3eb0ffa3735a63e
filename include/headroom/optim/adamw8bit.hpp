#pragma once
// AdamW8bit: AdamW with both moments block-wise dynamically quantized to 8
// bits (Dettmers et al. 2022, "8-bit Optimizers via Block-wise
// Quantization"; bitsandbytes' blockwise Adam): one byte per element and
// moment, one f32 absmax per block of 256 elements, and the two 256-entry
// dynamic code tables the model shares (the signed map for the first
// moment, the unsigned one for the second; math/dynamic_map.hpp). Element
// math: math/optim.hpp's adamw8bit_update_block.
#include <cstdint>
#include <span>
#include <string_view>

#include "../core/bytes.hpp"
#include "../core/config.hpp"
#include "../host/kernels/optimizer.hpp"
#include "../math/dynamic_map.hpp"
#include "../math/optim.hpp"
#include "adamw.hpp"
#include "optimizer.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/optimizer.cuh"

namespace headroom::cuda {

// One block of 256 threads per quantization block of 256 elements (thread i:
// element i), the per-element math of math::adamw8bit_update_block: the
// new moments' absmaxes by block_max (a max is exact in any order), then the
// update and the requantization with dynamic_quantize_value.
template <class O, class S>
__global__ __launch_bounds__(math::adam8bit_block) void adamw8bit_kernel(const ParamList list, const float* __restrict__ maps,
                                                                         const UpdateControl* __restrict__ control, bool clip) {
  static_assert(math::adam8bit_block == 256 && math::dynamic_map_size == 256,
                "adamw8bit_kernel: a thread per element and per map entry");
  const TensorEntry& e = list.find(blockIdx.x);
  if (optimizer_detail::update_stopped(control, e)) return;  // the whole block: before any barrier
  const math::AdamWStep<float> step = control->step_constants<math::AdamWStep<float>>();
  __shared__ float map_m[math::dynamic_map_size], map_v[math::dynamic_map_size], reduce[warp_size];
  map_m[threadIdx.x] = maps[threadIdx.x];
  map_v[threadIdx.x] = maps[math::dynamic_map_size + threadIdx.x];
  __syncthreads();

  const std::int64_t block = blockIdx.x - e.first_chunk;
  float* m_absmax = reinterpret_cast<float*>(e.state + state_offset<O, 0>(e.n));
  float* v_absmax = reinterpret_cast<float*>(e.state + state_offset<O, 1>(e.n));
  std::uint8_t* m_codes = reinterpret_cast<std::uint8_t*>(e.state + state_offset<O, 2>(e.n));
  std::uint8_t* v_codes = reinterpret_cast<std::uint8_t*>(e.state + state_offset<O, 3>(e.n));
  S* weight = static_cast<S*>(e.weight);
  const std::int64_t i = block * math::adam8bit_block + threadIdx.x;
  const bool active = i < e.n;

  float m = 0.0f, v = 0.0f, g = 0.0f;
  if (active) {
    m = map_m[m_codes[i]] * m_absmax[block];
    v = map_v[v_codes[i]] * v_absmax[block];
    g = to_float(static_cast<const S*>(e.grad)[i]) * (clip ? control->grad_scale : 1.0f);
    math::adam_moments(m, v, g, step);
  }
  const float m_amax = block_max<math::adam8bit_block>(m < 0.0f ? -m : m, reduce);
  const float v_amax = block_max<math::adam8bit_block>(v, reduce);
  if (active) {
    const float m_inv = m_amax > 0.0f ? 1.0f / m_amax : 0.0f;
    const float v_inv = v_amax > 0.0f ? 1.0f / v_amax : 0.0f;
    const float p = math::adamw_param(e.master != nullptr ? e.master[i] : to_float(weight[i]), m, v, step);
    if (e.master != nullptr) e.master[i] = p;
    weight[i] = from_float<S>(p);
    m_codes[i] = math::dynamic_quantize_value(m * m_inv, map_m);
    v_codes[i] = math::dynamic_quantize_value(v * v_inv, map_v);
  }
  if (threadIdx.x == 0) {
    m_absmax[block] = m_amax;
    v_absmax[block] = v_amax;
  }
}

}  // namespace headroom::cuda
#endif

namespace headroom {

template <class Beta1 = Ratio<9, 10>, class Beta2 = Ratio<999, 1000>, class WeightDecay = Ratio<1, 100>>
struct Adam8bitWith {
  using beta1 = Beta1;
  using beta2 = Beta2;
  using weight_decay = WeightDecay;
  static constexpr std::string_view name = "AdamW8bit";
  // [m absmax f32 x blocks][v absmax f32 x blocks][m codes u8 x n][v codes u8 x n]; the maps [signed 256][unsigned 256] f32
  static constexpr OptimDesc desc =
      OptimDesc::of(name, 2, "8-bit block-wise",
                    {StateSection{4, math::adam8bit_block}, StateSection{4, math::adam8bit_block}, StateSection{1, 1},
                     StateSection{1, 1}},
                    2 * math::dynamic_map_size * 4, math::adam8bit_block);

  template <class C>
  using Step = math::AdamWStep<float>;  // in f32 whatever the compute type (the blocks are)
  template <class C>
  static Step<C> step(double lr, int step_no) {
    return AdamWith<Beta1, Beta2, WeightDecay>::template step<float>(lr, step_no);
  }

  // the model's tables (desc.tables bytes): the signed map, then the unsigned one
  static void fill_table(float* maps) {
    math::make_dynamic_map(true, maps);
    math::make_dynamic_map(false, maps + math::dynamic_map_size);
  }

  template <class C>
  static void update(C* p, const C* g, const StateAt& state, std::int64_t n, const Step<C>& s, C grad_scale, const float* maps) {
    host::detail::adamw8bit_range(p, g, state.section<float>(0), state.section<float>(1), state.section<std::uint8_t>(2),
                                  state.section<std::uint8_t>(3), n, maps, s, grad_scale);
  }

#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void update(std::span<const cuda::ParamRef> params, const cuda::UpdateControl* control, const float* maps, bool clip,
                     cudaStream_t stream, int first_position) {
    cuda::optimizer_detail::for_each_list(params, math::adam8bit_block, first_position, [&](const cuda::ParamList& list, int) {
      cuda::launch(cuda::adamw8bit_kernel<Adam8bitWith, S>, "adamw8bit_kernel", dim3(static_cast<unsigned>(list.chunks)),
                   dim3(math::adam8bit_block), stream, list, maps, control, clip);
    });
  }
#endif
};

using AdamW8bit = Adam8bitWith<>;

}  // namespace headroom
