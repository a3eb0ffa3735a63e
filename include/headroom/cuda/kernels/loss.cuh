#pragma once
// The row part of the CUDA engine's fused LM head + cross-entropy (the GEMMs
// around it run on cuBLASLt): per row of logits the log-sum-exp, the loss and,
// in place, dlogits = (softmax - onehot(target)) * grad_scale, the formulas of
// math/cross_entropy.hpp; and the deterministic sum of the per-token losses.
//
// cross_entropy_rows gives each row one block: pass 1 runs a
// math::OnlineSoftmax per thread over its strided logits, merged across the
// warp and then across the warps in a fixed order; pass 2 rewrites the row.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../../math/softmax.hpp"
#include "../device.cuh"
#include "pointwise.cuh"

namespace headroom::cuda {

inline constexpr int cross_entropy_threads = 256;

// logits: (rows, V) in S at row stride ld, overwritten by dlogits when `gradient`
// (columns [V, ld) neither read nor written)  targets, row_loss: (rows)
// row_loss = lse - z_target (f32, from the logits as stored); W logits per load (V % W == 0, ld % W == 0)
template <class S, int W>
__global__ __launch_bounds__(cross_entropy_threads) void cross_entropy_rows_kernel(
    S* __restrict__ logits, const std::int32_t* __restrict__ targets, float* __restrict__ row_loss, float grad_scale,
    bool gradient, std::int64_t rows, std::int64_t vocab, std::int64_t ld) {
  constexpr int warps = cross_entropy_threads / warp_size;
  __shared__ float warp_m[warps], warp_s[warps];
  const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
  const std::int64_t row_packs = vocab / W;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    S* z = logits + r * ld;
    const std::int32_t target = targets[r];
    const float z_target = to_float(z[target]);  // read before the barriers below; pass 2 overwrites it

    math::OnlineSoftmax<float> stats;
    for (std::int64_t p = threadIdx.x; p < row_packs; p += cross_entropy_threads) {
      float v[W];
      packs::load(z + p * W, v);
#pragma unroll
      for (int e = 0; e < W; ++e) stats.update(v[e]);
    }
    // merge down the warp to lane 0, then every thread merges the warps in order
    for (int o = warp_size / 2; o > 0; o /= 2) {
      math::OnlineSoftmax<float> other;
      other.m = __shfl_down_sync(full_mask, stats.m, o);
      other.s = __shfl_down_sync(full_mask, stats.s, o);
      if (lane + o < warp_size) stats.merge(other);
    }
    if (lane == 0) {
      warp_m[warp] = stats.m;
      warp_s[warp] = stats.s;
    }
    __syncthreads();
    math::OnlineSoftmax<float> row;
    for (int k = 0; k < warps; ++k) {
      math::OnlineSoftmax<float> part;
      part.m = warp_m[k];
      part.s = warp_s[k];
      row.merge(part);
    }
    __syncthreads();  // warp_m / warp_s are free for the next row

    if (threadIdx.x == 0) row_loss[r] = row.lse() - z_target;
    if (gradient) {
      const float inv = grad_scale / row.s;
      for (std::int64_t p = threadIdx.x; p < row_packs; p += cross_entropy_threads) {
        float v[W];
        packs::load(z + p * W, v);
#pragma unroll
        for (int e = 0; e < W; ++e) {
          v[e] = expf(v[e] - row.m) * inv;
          if (p * W + e == target) v[e] -= grad_scale;
        }
        packs::store(z + p * W, v);
      }
    }
  }
}

// logits: (rows, V) in S at row stride ld (>= V; the LM head pads it:
// CudaWorkspace::lm_head_logits_ld), overwritten by dlogits = (softmax -
// onehot) * grad_scale when `gradient`; the padding columns are ignored
// targets: (rows)  row_loss: (rows) f32 = lse - z_target
template <class S>
void cross_entropy_rows(S* logits, const std::int32_t* targets, float* row_loss, float grad_scale, bool gradient,
                        std::int64_t rows, std::int64_t vocab, std::int64_t ld, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return;
  if (ld < vocab)
    throw std::invalid_argument("cross_entropy_rows: row stride " + std::to_string(ld) + " is below the vocabulary " +
                                std::to_string(vocab));
  constexpr int W = packs::width<S>;
  const dim3 grid(static_cast<unsigned>(rows < 65535 ? rows : 65535)), block(cross_entropy_threads);
  if (vocab % W == 0 && ld % W == 0 && packs::aligned(logits))
    launch(cross_entropy_rows_kernel<S, W>, "cross_entropy_rows_kernel", grid, block, stream, logits, targets, row_loss,
           grad_scale, gradient, rows, vocab, ld);
  else
    launch(cross_entropy_rows_kernel<S, 1>, "cross_entropy_rows_kernel", grid, block, stream, logits, targets, row_loss,
           grad_scale, gradient, rows, vocab, ld);
}

// out[0] = sum of x: (n), by one block: thread t adds x[t], x[t + 1024], ... in
// order, then block_sum's fixed tree (deterministic).
inline constexpr int sum_rows_threads = 1024;

template <int Threads>
__global__ __launch_bounds__(Threads) void sum_rows_kernel(const float* __restrict__ x, std::int64_t n, float* __restrict__ out) {
  __shared__ float reduce[warp_size];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < n; i += Threads) s += x[i];
  s = block_sum<Threads>(s, reduce);
  if (threadIdx.x == 0) out[0] = s;
}

// row_loss: (n) per-token losses  out: (1) their sum (for the mean loss the trainer reads back)
inline void sum_rows(const float* row_loss, std::int64_t n, float* out, cudaStream_t stream) {
  launch(sum_rows_kernel<sum_rows_threads>, "sum_rows_kernel", dim3(1), dim3(sum_rows_threads), stream, row_loss, n, out);
}

}  // namespace headroom::cuda
