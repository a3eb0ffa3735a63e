#pragma once
// The row part of the CUDA engine's fused LM head + cross-entropy (the GEMMs
// around it run on cuBLASLt): per row of logits the log-sum-exp, the loss and,
// in place, dlogits = (softmax - onehot(target)) * grad_scale, the formulas of
// math/cross_entropy.hpp; and the deterministic sum of the per-token losses.
//
// cross_entropy_rows gives each row one block: pass 1 runs a
// math::OnlineSoftmax per thread over its strided logits, merged across the
// warp and then across the warps in a fixed order; pass 2 rewrites the row.
// With tensor parallelism (a vocabulary-parallel LM head), pass 1 gives each
// row's max, sum and target logit over this rank's columns, the ranks
// exchange them, and pass 2 uses the combined log-sum-exp.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../../math/softmax.hpp"
#include "../device.cuh"
#include "pointwise.cuh"

namespace headroom::cuda {

inline constexpr int cross_entropy_threads = 256;

// Pass 1 of a row of V logits (row_packs packs of W): a math::OnlineSoftmax
// per thread over its strided logits, merged down each warp and then across
// the warps in a fixed order; every thread returns the row's max and sum.
// warp_m, warp_s: the block's __shared__ (one per warp); free again on return.
template <class S, int W>
__device__ math::OnlineSoftmax<float> row_softmax(const S* z, std::int64_t row_packs, float* warp_m, float* warp_s) {
  constexpr int warps = cross_entropy_threads / warp_size;
  const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
  math::OnlineSoftmax<float> stats;
  for (std::int64_t p = threadIdx.x; p < row_packs; p += cross_entropy_threads) {
    float v[W];
    packs::load(z + p * W, v);
#pragma unroll
    for (int e = 0; e < W; ++e) stats.update(v[e]);
  }
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
  return row;
}

// Pass 2: z = exp(z - m) * inv, and grad_scale less at column `target` (none
// when it is outside [0, V)): dlogits in place.
template <class S, int W>
__device__ void row_dlogits(S* z, std::int64_t row_packs, float m, float inv, std::int64_t target, float grad_scale) {
  for (std::int64_t p = threadIdx.x; p < row_packs; p += cross_entropy_threads) {
    float v[W];
    packs::load(z + p * W, v);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      v[e] = expf(v[e] - m) * inv;
      if (p * W + e == target) v[e] -= grad_scale;
    }
    packs::store(z + p * W, v);
  }
}

// logits: (rows, V) in S at row stride ld, overwritten by dlogits when `gradient`
// (columns [V, ld) neither read nor written)  targets, row_loss: (rows)
// row_loss = lse - z_target (f32, from the logits as stored); W logits per load (V % W == 0, ld % W == 0)
template <class S, int W>
__global__ __launch_bounds__(cross_entropy_threads) void cross_entropy_rows_kernel(
    S* __restrict__ logits, const std::int32_t* __restrict__ targets, float* __restrict__ row_loss, float grad_scale,
    const float* __restrict__ loss_scale, bool gradient, std::int64_t rows, std::int64_t vocab, std::int64_t ld) {
  constexpr int warps = cross_entropy_threads / warp_size;
  __shared__ float warp_m[warps], warp_s[warps];
  const std::int64_t row_packs = vocab / W;
  if (loss_scale != nullptr) grad_scale *= *loss_scale;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    S* z = logits + r * ld;
    const std::int32_t target = targets[r];
    const float z_target = to_float(z[target]);  // read before the barriers below; pass 2 overwrites it
    const math::OnlineSoftmax<float> row = row_softmax<S, W>(z, row_packs, warp_m, warp_s);
    if (threadIdx.x == 0) row_loss[r] = row.lse() - z_target;
    if (gradient) row_dlogits<S, W>(z, row_packs, row.m, grad_scale / row.s, target, grad_scale);
  }
}

// Vocabulary-parallel, step 1 (before the ranks exchange): for each row of
// this rank's logits (rows [first, first + V) of the whole vocabulary),
// stats[3 r ..] = its max, its sum of exp(z - max) and its target's logit (0
// where another rank holds the target).
template <class S, int W>
__global__ __launch_bounds__(cross_entropy_threads) void vocab_parallel_stats_kernel(
    const S* __restrict__ logits, const std::int32_t* __restrict__ targets, float* __restrict__ stats, std::int64_t rows,
    std::int64_t vocab, std::int64_t ld, std::int64_t first) {
  constexpr int warps = cross_entropy_threads / warp_size;
  __shared__ float warp_m[warps], warp_s[warps];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* z = logits + r * ld;
    const std::int64_t t = static_cast<std::int64_t>(targets[r]) - first;
    const math::OnlineSoftmax<float> row = row_softmax<S, W>(z, vocab / W, warp_m, warp_s);
    if (threadIdx.x == 0) {
      stats[3 * r] = row.m;
      stats[3 * r + 1] = row.s;
      stats[3 * r + 2] = t >= 0 && t < vocab ? to_float(z[t]) : 0.0f;
    }
  }
}

// Vocabulary-parallel, step 2: stats holds every rank's (ranks, chunk, 3);
// each row's log-sum-exp and target logit combine them in rank order (so
// every rank computes the same loss), then this rank's columns become
// dlogits when `gradient`.
template <class S, int W>
__global__ __launch_bounds__(cross_entropy_threads) void vocab_parallel_rows_kernel(
    S* __restrict__ logits, const std::int32_t* __restrict__ targets, const float* __restrict__ stats, float* __restrict__ row_loss,
    float grad_scale, const float* __restrict__ loss_scale, bool gradient, std::int64_t rows, std::int64_t vocab, std::int64_t ld,
    std::int64_t first, std::int64_t chunk, int ranks) {
  if (loss_scale != nullptr) grad_scale *= *loss_scale;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float m = stats[3 * r], s = 0.0f, target = 0.0f;
    for (int q = 1; q < ranks; ++q) m = fmaxf(m, stats[(q * chunk + r) * 3]);
    for (int q = 0; q < ranks; ++q) {
      const float* st = stats + (q * chunk + r) * 3;
      s += st[1] * expf(st[0] - m);
      target += st[2];
    }
    const float lse = m + logf(s);
    if (threadIdx.x == 0) row_loss[r] = lse - target;
    if (gradient) row_dlogits<S, W>(logits + r * ld, vocab / W, lse, grad_scale, static_cast<std::int64_t>(targets[r]) - first, grad_scale);
  }
}

// logits: (rows, V) in S at row stride ld (>= V; the LM head pads it:
// CudaWorkspace::lm_head_logits_ld), overwritten by dlogits = (softmax -
// onehot) * grad_scale (times *loss_scale, a device value, unless null) when
// `gradient`; the padding columns are ignored
// targets: (rows)  row_loss: (rows) f32 = lse - z_target
template <class S>
void cross_entropy_rows(S* logits, const std::int32_t* targets, float* row_loss, float grad_scale, const float* loss_scale,
                        bool gradient, std::int64_t rows, std::int64_t vocab, std::int64_t ld, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return;
  if (ld < vocab)
    throw std::invalid_argument("cross_entropy_rows: row stride " + std::to_string(ld) + " is below the vocabulary " +
                                std::to_string(vocab));
  constexpr int W = packs::width<S>;
  const dim3 grid(static_cast<unsigned>(rows < 65535 ? rows : 65535)), block(cross_entropy_threads);
  if (vocab % W == 0 && ld % W == 0 && packs::aligned(logits))
    launch(cross_entropy_rows_kernel<S, W>, "cross_entropy_rows_kernel", grid, block, stream, logits, targets, row_loss,
           grad_scale, loss_scale, gradient, rows, vocab, ld);
  else
    launch(cross_entropy_rows_kernel<S, 1>, "cross_entropy_rows_kernel", grid, block, stream, logits, targets, row_loss,
           grad_scale, loss_scale, gradient, rows, vocab, ld);
}

// Vocabulary-parallel cross-entropy of one chunk, on this rank's logits (rows,
// V) at stride ld, columns [first, first + V) of the whole vocabulary; stats:
// (ranks, chunk, 3) f32, this rank's block at `rank`. gather(stats) must fill
// the other ranks' blocks (an all-gather of chunk x 3 f32 per rank, enqueued
// on `stream`) between the two kernels. row_loss: (rows) f32, the whole
// vocabulary's lse - z_target, equal on every rank.
template <class S, class Gather>
void cross_entropy_rows_vocab_parallel(S* logits, const std::int32_t* targets, float* row_loss, float grad_scale,
                                       const float* loss_scale, bool gradient,
                                       std::int64_t rows, std::int64_t vocab, std::int64_t ld, std::int64_t first, float* stats,
                                       std::int64_t chunk, int rank, int ranks, Gather&& gather, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return;
  if (ld < vocab || rows > chunk)
    throw std::invalid_argument("cross_entropy_rows_vocab_parallel: " + std::to_string(rows) + " rows of a chunk of " +
                                std::to_string(chunk) + ", row stride " + std::to_string(ld) + " for a vocabulary block of " +
                                std::to_string(vocab));
  constexpr int W = packs::width<S>;
  const dim3 grid(static_cast<unsigned>(rows < 65535 ? rows : 65535)), block(cross_entropy_threads);
  const bool packed = vocab % W == 0 && ld % W == 0 && packs::aligned(logits);
  float* own = stats + static_cast<std::int64_t>(rank) * chunk * 3;
  if (packed)
    launch(vocab_parallel_stats_kernel<S, W>, "vocab_parallel_stats_kernel", grid, block, stream, logits, targets, own, rows, vocab, ld, first);
  else
    launch(vocab_parallel_stats_kernel<S, 1>, "vocab_parallel_stats_kernel", grid, block, stream, logits, targets, own, rows, vocab, ld, first);
  gather(stats);
  if (packed)
    launch(vocab_parallel_rows_kernel<S, W>, "vocab_parallel_rows_kernel", grid, block, stream, logits, targets, stats, row_loss,
           grad_scale, loss_scale, gradient, rows, vocab, ld, first, chunk, ranks);
  else
    launch(vocab_parallel_rows_kernel<S, 1>, "vocab_parallel_rows_kernel", grid, block, stream, logits, targets, stats, row_loss,
           grad_scale, loss_scale, gradient, rows, vocab, ld, first, chunk, ranks);
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
