#pragma once
// Element-wise and row-wise kernels of the CUDA engine, the counterparts of
// host/kernels/pointwise.hpp: token embedding and learned positions (forward
// and backward), RMSNorm / LayerNorm (saving f32 row statistics), GELU,
// SwiGLU, the residual add and gradient accumulation, column sums (bias
// gradients) and storage-type casts. Element math in f32: math/activations.hpp,
// and the formulas of math/norms.hpp (whose row loops a block splits).
//
// Element-wise kernels read and write 16-byte packs (4 floats, 8 bf16) where
// every pointer is 16-byte aligned (the arena aligns each buffer to 256
// bytes), with a scalar tail, over a grid-stride loop. Column sums are
// deterministic: each column is summed by the threads of one block in a fixed
// order (no atomics, no scratch). The embedding backward is the exception:
// it scatters with atomicAdd (see embedding_backward).
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "../../math/activations.hpp"
#include "../../math/norms.hpp"
#include "../device.cuh"

namespace headroom::cuda {

// ---- packs: up to 16 bytes per load / store ------------------------------------------------------------------------
// (also used by loss.cuh and optimizer.cuh)
namespace packs {

template <class T>
inline constexpr int width = 16 / static_cast<int>(sizeof(T));  // elements in 16 bytes

template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <int W>
using Width = std::integral_constant<int, W>;

// W elements of p as f32, in loads of at most 16 bytes (p aligned to them).
template <int W, class T>
__device__ __forceinline__ void load(const T* p, float (&f)[W]) {
  constexpr int per = static_cast<int>(sizeof(T)) * W > 16 ? width<T> : W;
#pragma unroll
  for (int k = 0; k < W; k += per) {
    const Pack<T, per> v = *reinterpret_cast<const Pack<T, per>*>(p + k);
#pragma unroll
    for (int e = 0; e < per; ++e) f[k + e] = to_float(v.v[e]);
  }
}

// W f32 values rounded to T into p, in stores of at most 16 bytes.
template <int W, class T>
__device__ __forceinline__ void store(T* p, const float (&f)[W]) {
  constexpr int per = static_cast<int>(sizeof(T)) * W > 16 ? width<T> : W;
#pragma unroll
  for (int k = 0; k < W; k += per) {
    Pack<T, per> v;
#pragma unroll
    for (int e = 0; e < per; ++e) v.v[e] = from_float<T>(f[k + e]);
    *reinterpret_cast<Pack<T, per>*>(p + k) = v;
  }
}

// f(i, Width<W>) for the packs [i, i + W) below n - n % W, then f(i, Width<1>)
// for the tail; the grid's threads stride over both.
template <int W, class F>
__device__ __forceinline__ void grid_stride(std::int64_t n, F&& f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t full = n / W * W;
  for (std::int64_t i = first * W; i < full; i += stride * W) f(i, Width<W>{});
  if constexpr (W > 1)
    for (std::int64_t i = full + first; i < n; i += stride) f(i, Width<1>{});
}

// 16-byte alignment (null counts as aligned: an absent operand)
HEADROOM_HOST_DEVICE inline bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
template <class... P>
HEADROOM_HOST_DEVICE bool all_aligned(const P*... p) {
  return (aligned(p) && ...);
}

inline constexpr int threads = 256;               // element-wise blocks
inline constexpr int row_threads = 128;           // blocks that own a row (embedding, positions)
inline constexpr std::int64_t max_blocks = 4096;  // grid-stride loops cover the rest

inline dim3 grid_for(std::int64_t items, int block) {
  const std::int64_t blocks = ceil_div(items, block);
  return dim3(static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks));
}

// Launches go(Width<W>{}, grid) for n elements in packs of W when `vectorized`,
// else go(Width<1>{}, grid); nothing when n is 0.
template <int W, class Go>
void elementwise(std::int64_t n, bool vectorized, Go&& go) {
  if (n <= 0) return;
  if (vectorized) go(Width<W>{}, grid_for(n / W + n % W, threads));
  else go(Width<1>{}, grid_for(n, threads));
}

}  // namespace packs

// ---- embedding and positions ---------------------------------------------------------------------------------------

// tokens: (N)  table: (V, D), rows [first, first + V) of the whole vocabulary
// (tensor parallelism: this rank's block)  out: (N, D) = table[tokens - first],
// a zero row for a token outside the block; W columns per copy (D % W == 0)
template <class S, int W>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens, const S* __restrict__ table,
                                         S* __restrict__ out, std::int64_t n, std::int64_t d, std::int64_t first, std::int64_t vocab) {
  using P = packs::Pack<S, W>;
  const std::int64_t row_packs = d / W;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const std::int64_t row = static_cast<std::int64_t>(tokens[r]) - first;
    P* dst = reinterpret_cast<P*>(out + r * d);
    if (row < 0 || row >= vocab) {
      for (std::int64_t j = threadIdx.x; j < row_packs; j += blockDim.x) {
        float zero[W] = {};
        packs::store(out + r * d + j * W, zero);
      }
      continue;
    }
    const P* src = reinterpret_cast<const P*>(table + row * d);
    for (std::int64_t j = threadIdx.x; j < row_packs; j += blockDim.x) dst[j] = src[j];
  }
}

// first, vocab: the rows the table holds (0 and the whole vocabulary without tensor parallelism)
template <class S>
void embedding_forward(const std::int32_t* tokens, const S* table, S* out, std::int64_t n, std::int64_t d, std::int64_t first,
                       std::int64_t vocab, cudaStream_t stream) {
  if (n <= 0 || d <= 0) return;
  constexpr int W = packs::width<S>;
  const dim3 grid = packs::grid_for(n, 1), block(packs::row_threads);
  if (d % W == 0 && packs::all_aligned(table, out))
    launch(embedding_forward_kernel<S, W>, "embedding_forward_kernel", grid, block, stream, tokens, table, out, n, d, first, vocab);
  else
    launch(embedding_forward_kernel<S, 1>, "embedding_forward_kernel", grid, block, stream, tokens, table, out, n, d, first, vocab);
}

// x: (n) = 0
template <class S, int W>
__global__ void fill_zero_kernel(S* __restrict__ x, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    float zero[decltype(width)::value] = {};
    packs::store(x + i, zero);
  });
}

// dtable[tokens[r] - first] += dy[r] for every row r whose token the table
// holds (atomically: rows may repeat)
template <class S>
__global__ void embedding_scatter_kernel(const std::int32_t* __restrict__ tokens, const S* __restrict__ dy, S* dtable,
                                         std::int64_t n, std::int64_t d, std::int64_t first, std::int64_t vocab) {
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const std::int64_t row = static_cast<std::int64_t>(tokens[r]) - first;
    if (row < 0 || row >= vocab) continue;  // another rank's row
    S* dst = dtable + row * d;
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(dst + j, dy[r * d + j]);
  }
}

// tokens: (N)  dy: (N, D)  dtable: (V, D), rows [first_row, first_row + V) of
// the whole vocabulary. first: the whole table is zeroed, then every row of dy
// is added to its token's row (rows of tokens outside the block: nowhere).
// Precision: the scatter adds in S with atomicAdd, so with S = bf16 every
// addition is rounded to bf16 (8 significant bits): a token seen k times in
// the batch collects k roundings, an error up to about k 2^-8 of the sum of
// the magnitudes added (the host sums in f32 and rounds once), and since
// the order of the atomics varies from run to run, so do the low bits of the
// result (with f32 too): this gradient is not bitwise deterministic.
template <class S>
void embedding_backward(const std::int32_t* tokens, const S* dy, S* dtable, bool first, std::int64_t n, std::int64_t vocab,
                        std::int64_t d, std::int64_t first_row, cudaStream_t stream) {
  if (first)
    packs::elementwise<packs::width<S>>(vocab * d, packs::aligned(dtable), [&](auto w, dim3 grid) {
      launch(fill_zero_kernel<S, decltype(w)::value>, "fill_zero_kernel", grid, dim3(packs::threads), stream, dtable, vocab * d);
    });
  if (n <= 0 || d <= 0) return;
  launch(embedding_scatter_kernel<S>, "embedding_scatter_kernel", packs::grid_for(n, 1), dim3(packs::row_threads), stream, tokens, dy, dtable, n, d,
         first_row, vocab);
}

// x: (B*T, D) += table[t] for row b*T + t; W columns per step (D % W == 0)
template <class S, int W>
__global__ void positions_forward_kernel(const S* __restrict__ table, S* __restrict__ x, std::int64_t rows, std::int64_t seq,
                                         std::int64_t d) {
  const std::int64_t row_packs = d / W;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* p = table + (r % seq) * d;
    S* xr = x + r * d;
    for (std::int64_t j = threadIdx.x * W; j < row_packs * W; j += blockDim.x * W) {
      float a[W], b[W];
      packs::load(xr + j, a);
      packs::load(p + j, b);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] += b[k];
      packs::store(xr + j, a);
    }
  }
}

template <class S>
void positions_forward(const S* table, S* x, std::int64_t batch, std::int64_t seq, std::int64_t d, cudaStream_t stream) {
  const std::int64_t rows = batch * seq;
  if (rows <= 0 || d <= 0) return;
  constexpr int W = packs::width<S>;
  const dim3 grid = packs::grid_for(rows, 1), block(packs::row_threads);
  if (d % W == 0 && packs::all_aligned(table, x))
    launch(positions_forward_kernel<S, W>, "positions_forward_kernel", grid, block, stream, table, x, rows, seq, d);
  else
    launch(positions_forward_kernel<S, 1>, "positions_forward_kernel", grid, block, stream, table, x, rows, seq, d);
}

// dtable: (P, D); row t < seq (+)= sum over b of dx[b*seq + t] (in b order, f32);
// rows t >= seq are zeroed when first (as the host does), else left alone.
template <class S, int W>
__global__ void positions_backward_kernel(const S* __restrict__ dx, S* __restrict__ dtable, bool first, std::int64_t batch,
                                          std::int64_t seq, std::int64_t positions, std::int64_t d) {
  const std::int64_t row_packs = d / W;
  for (std::int64_t t = blockIdx.x; t < positions; t += gridDim.x) {
    if (t >= seq && !first) continue;
    S* dst = dtable + t * d;
    for (std::int64_t j = threadIdx.x * W; j < row_packs * W; j += blockDim.x * W) {
      float s[W] = {};
      for (std::int64_t b = 0; t < seq && b < batch; ++b) {
        float v[W];
        packs::load(dx + (b * seq + t) * d + j, v);
#pragma unroll
        for (int k = 0; k < W; ++k) s[k] += v[k];
      }
      if (!first) {
        float old[W];
        packs::load(dst + j, old);
#pragma unroll
        for (int k = 0; k < W; ++k) s[k] = old[k] + s[k];
      }
      packs::store(dst + j, s);
    }
  }
}

template <class S>
void positions_backward(const S* dx, S* dtable, bool first, std::int64_t batch, std::int64_t seq, std::int64_t positions,
                        std::int64_t d, cudaStream_t stream) {
  if (positions <= 0 || d <= 0) return;
  constexpr int W = packs::width<S>;
  const dim3 grid = packs::grid_for(positions, 1), block(packs::row_threads);
  if (d % W == 0 && packs::all_aligned(dx, dtable))
    launch(positions_backward_kernel<S, W>, "positions_backward_kernel", grid, block, stream, dx, dtable, first, batch, seq, positions, d);
  else
    launch(positions_backward_kernel<S, 1>, "positions_backward_kernel", grid, block, stream, dx, dtable, first, batch, seq, positions, d);
}

// ---- RMSNorm / LayerNorm -------------------------------------------------------------------------------------------
// One block per row (grid-stride over rows). Each thread keeps its Packs
// packs of W row values in registers, so x (and dy) are read once: pack p of
// the row belongs to thread p % Threads. The launcher picks the smallest Packs
// (a power of two, Packs * W <= norm_values<Threads>) that covers the row with
// 256 threads (rows up to 8192), else with 1024 (up to 16384; a 1024-thread
// block has 64 registers a thread).

inline constexpr float norm_eps = static_cast<float>(math::norm_eps);  // the default epsilon (math/norms.hpp)
template <int Threads>
inline constexpr int norm_values = Threads > 256 ? 16 : 32;  // most row values a thread holds per array

// x, y: (N, D)  w, b: (D) (b null: no bias)  mean, rstd: (N) f32 (mean null for RMSNorm).
// RMSNorm is LayerNorm with the mean fixed at 0 and no bias: y = (x - mu) rstd w (+ b),
// rstd = 1 / sqrt(mean((x - mu)^2) + eps) (math/norms.hpp).
template <class S, int Threads, int W, int Packs>
__global__ __launch_bounds__(Threads) void norm_forward_kernel(bool layer, const S* __restrict__ x, const S* __restrict__ w,
                                                               const S* __restrict__ b, S* __restrict__ y, float* mean,
                                                               float* rstd, std::int64_t n, std::int64_t d, float eps) {
  __shared__ float reduce[warp_size];
  const std::int64_t row_packs = d / W;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    float v[Packs][W] = {};  // zero past the row's end
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const std::int64_t p = threadIdx.x + k * Threads;
      if (p < row_packs) {
        packs::load(x + r * d + p * W, v[k]);
#pragma unroll
        for (int e = 0; e < W; ++e) sum += v[k][e];
      }
    }
    const float mu = layer ? block_sum<Threads>(sum, reduce) / static_cast<float>(d) : 0.0f;
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < Packs; ++k)
      if (threadIdx.x + k * Threads < row_packs)
#pragma unroll
        for (int e = 0; e < W; ++e) squares += (v[k][e] - mu) * (v[k][e] - mu);
    const float rs = 1.0f / sqrtf(block_sum<Threads>(squares, reduce) / static_cast<float>(d) + eps);
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const std::int64_t p = threadIdx.x + k * Threads;
      if (p < row_packs) {
        float wv[W], bv[W] = {};
        packs::load(w + p * W, wv);
        if (b != nullptr) packs::load(b + p * W, bv);
        float out[W];
#pragma unroll
        for (int e = 0; e < W; ++e) out[e] = (v[k][e] - mu) * rs * wv[e] + bv[e];
        packs::store(y + r * d + p * W, out);
      }
    }
    if (threadIdx.x == 0) {
      if (mean != nullptr) mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// dx (N, D) (+)= the rows' input gradient from the saved statistics, gw = dy w:
//   RMSNorm   dx = rstd (gw - xhat mean(gw xhat))
//   LayerNorm dx = rstd (gw - mean(gw) - xhat mean(gw xhat))
template <class S, int Threads, int W, int Packs>
__global__ __launch_bounds__(Threads) void norm_backward_rows_kernel(bool layer, const S* __restrict__ x, const S* __restrict__ w,
                                                                     const float* __restrict__ mean,
                                                                     const float* __restrict__ rstd, const S* __restrict__ dy,
                                                                     S* __restrict__ dx, bool dx_first, std::int64_t n,
                                                                     std::int64_t d) {
  __shared__ float reduce[warp_size];
  const std::int64_t row_packs = d / W;
  for (std::int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float mu = layer ? mean[r] : 0.0f, rs = rstd[r];
    float xhat[Packs][W] = {}, gw[Packs][W] = {};
    float sum_g = 0.0f, dot = 0.0f;
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const std::int64_t p = threadIdx.x + k * Threads;
      if (p < row_packs) {
        float wv[W];
        packs::load(x + r * d + p * W, xhat[k]);
        packs::load(dy + r * d + p * W, gw[k]);
        packs::load(w + p * W, wv);
#pragma unroll
        for (int e = 0; e < W; ++e) {
          xhat[k][e] = (xhat[k][e] - mu) * rs;
          gw[k][e] *= wv[e];
          sum_g += gw[k][e];
          dot += gw[k][e] * xhat[k][e];
        }
      }
    }
    const float mean_g = layer ? block_sum<Threads>(sum_g, reduce) / static_cast<float>(d) : 0.0f;
    const float mean_gx = block_sum<Threads>(dot, reduce) / static_cast<float>(d);
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const std::int64_t p = threadIdx.x + k * Threads;
      if (p < row_packs) {
        float out[W], old[W];
        if (!dx_first) packs::load(dx + r * d + p * W, old);
#pragma unroll
        for (int e = 0; e < W; ++e) {
          const float g = rs * (gw[k][e] - mean_g - xhat[k][e] * mean_gx);
          out[e] = dx_first ? g : old[e] + g;
        }
        packs::store(dx + r * d + p * W, out);
      }
    }
  }
}

// Column sums of (N, D) terms, deterministic: a block owns 32 columns; its
// 32 slices of 32 threads (a warp: 32 adjacent columns of a row) each sum
// rows slice, slice + 32, ... in order, and slice 0 adds the 32 partial sums
// in slice order. (Without scratch memory or atomics a column cannot be
// split across blocks: D / 32 blocks of 1024 threads.)
//   dw[j] (+)= sum_r dy[r, j] xhat[r, j]   (x null: no dw)
//   db[j] (+)= sum_r dy[r, j]              (db null: no db)
// with xhat = (x - mean) rstd (LayerNorm) or x rstd (RMSNorm, mean null).
inline constexpr int column_tile = warp_size, column_slices = 32;

template <class S>
__global__ __launch_bounds__(column_tile * column_slices) void column_sums_kernel(
    const S* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd, const S* __restrict__ dy,
    S* __restrict__ dw, bool dw_first, S* __restrict__ db, bool db_first, std::int64_t n, std::int64_t d) {
  __shared__ float part_w[column_slices][column_tile], part_b[column_slices][column_tile];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * column_tile + threadIdx.x;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (j < d)
    for (std::int64_t r = threadIdx.y; r < n; r += column_slices) {
      const float g = to_float(dy[r * d + j]);
      if (dw != nullptr) acc_w += g * ((to_float(x[r * d + j]) - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r]);
      acc_b += g;
    }
  part_w[threadIdx.y][threadIdx.x] = acc_w;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && j < d) {
    float sw = 0.0f, sb = 0.0f;
    for (int s = 0; s < column_slices; ++s) {
      sw += part_w[s][threadIdx.x];
      sb += part_b[s][threadIdx.x];
    }
    if (dw != nullptr) dw[j] = from_float<S>(dw_first ? sw : to_float(dw[j]) + sw);
    if (db != nullptr) db[j] = from_float<S>(db_first ? sb : to_float(db[j]) + sb);
  }
}

namespace pointwise_detail {

// Calls go(Width<Threads>, Width<W>, Width<Packs>) for the smallest register
// footprint covering a row of d elements; W = 16-byte packs when `vectorized`.
template <int Threads, int W, int Packs, class Go>
void norm_packs(std::int64_t row_packs, Go& go) {
  if constexpr (Packs * W < norm_values<Threads>)
    if (row_packs > static_cast<std::int64_t>(Threads) * Packs) return norm_packs<Threads, W, Packs * 2>(row_packs, go);
  go(packs::Width<Threads>{}, packs::Width<W>{}, packs::Width<Packs>{});
}
template <int W, class Go>
void norm_shape(std::int64_t d, Go& go) {
  const std::int64_t row_packs = d / W;
  if (row_packs <= 256 * (norm_values<256> / W)) norm_packs<256, W, 1>(row_packs, go);
  else if (row_packs <= 1024 * (norm_values<1024> / W)) norm_packs<1024, W, 1>(row_packs, go);
  else throw std::invalid_argument("cuda norm kernels: rows of more than 16384 elements are not supported");
}
template <class S, class Go>
void norm_dispatch(std::int64_t d, bool vectorized, Go&& go) {
  constexpr int W = packs::width<S>;
  if (vectorized && d % W == 0) norm_shape<W>(d, go);
  else norm_shape<1>(d, go);
}

inline dim3 rows_grid(std::int64_t n) { return dim3(static_cast<unsigned>(n < 65535 ? n : 65535)); }

}  // namespace pointwise_detail

// x, y: (N, D)  w, b: (D) (b: LayerNorm bias, may be null)  mean (N, LayerNorm only), rstd (N): f32;
// eps: the model's (rms_norm_eps, layer_norm_epsilon)
template <class S>
void norm_forward(bool layer, const S* x, const S* w, const S* b, S* y, float* mean, float* rstd, std::int64_t n, std::int64_t d,
                  cudaStream_t stream, float eps = norm_eps) {
  if (n <= 0 || d <= 0) return;
  pointwise_detail::norm_dispatch<S>(d, packs::all_aligned(x, w, b, y), [&](auto threads, auto width, auto held) {
    launch(norm_forward_kernel<S, decltype(threads)::value, decltype(width)::value, decltype(held)::value>, "norm_forward_kernel",
           pointwise_detail::rows_grid(n), dim3(decltype(threads)::value), stream, layer, x, w, layer ? b : nullptr, y,
           layer ? mean : nullptr, rstd, n, d, eps);
  });
}

// x, dy, dx: (N, D)  w, dw, db: (D)  mean, rstd: (N) saved by the forward (mean: LayerNorm only).
// dx (+)= input gradient (per row); dw (+)= sum_r dy xhat, db (+)= sum_r dy (a
// second, deterministic column pass). Any of dx, dw, db may be null.
template <class S>
void norm_backward(bool layer, const S* x, const S* w, const float* mean, const float* rstd, const S* dy, S* dx, bool dx_first,
                   S* dw, bool dw_first, S* db, bool db_first, std::int64_t n, std::int64_t d, cudaStream_t stream) {
  if (d <= 0) return;
  if (!layer) mean = nullptr;  // RMSNorm: xhat = x rstd
  if (dx != nullptr && n > 0)
    pointwise_detail::norm_dispatch<S>(d, packs::all_aligned(x, w, dy, dx), [&](auto threads, auto width, auto held) {
      launch(norm_backward_rows_kernel<S, decltype(threads)::value, decltype(width)::value, decltype(held)::value>, "norm_backward_rows_kernel",
             pointwise_detail::rows_grid(n), dim3(decltype(threads)::value), stream, layer, x, w, mean, rstd, dy, dx, dx_first, n, d);
    });
  if (dw != nullptr || db != nullptr)
    launch(column_sums_kernel<S>, "column_sums_kernel", dim3(static_cast<unsigned>(ceil_div(d, column_tile))), dim3(column_tile, column_slices), stream,
           dw != nullptr ? x : nullptr, mean, rstd, dy, dw, dw_first, db, db_first, n, d);
}

// dy: (N, D)  db: (D) (+)= sum over rows of dy (the bias gradient), deterministic
template <class S>
void column_sums(const S* dy, S* db, bool first, std::int64_t n, std::int64_t d, cudaStream_t stream) {
  if (d <= 0) return;
  launch(column_sums_kernel<S>, "column_sums_kernel", dim3(static_cast<unsigned>(ceil_div(d, column_tile))), dim3(column_tile, column_slices), stream,
         static_cast<const S*>(nullptr), static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), dy,
         static_cast<S*>(nullptr), false, db, first, n, d);
}

// ---- activations ---------------------------------------------------------------------------------------------------

// y = gelu_tanh(x)
template <class S, int W>
__global__ void gelu_forward_kernel(const S* __restrict__ x, S* __restrict__ y, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    float v[decltype(width)::value];
    packs::load(x + i, v);
    for (float& e : v) e = math::gelu_tanh(e);
    packs::store(y + i, v);
  });
}
// dx (+)= dy gelu_tanh'(x)
template <class S, int W>
__global__ void gelu_backward_kernel(const S* __restrict__ x, const S* __restrict__ dy, S* __restrict__ dx, bool first,
                                     std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float xv[K], g[K], old[K];
    packs::load(x + i, xv);
    packs::load(dy + i, g);
    if (!first) packs::load(dx + i, old);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      g[k] *= math::gelu_tanh_grad(xv[k]);
      if (!first) g[k] = old[k] + g[k];
    }
    packs::store(dx + i, g);
  });
}

// x, y: (n)
template <class S>
void gelu_forward(const S* x, S* y, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(x, y), [&](auto w, dim3 grid) {
    launch(gelu_forward_kernel<S, decltype(w)::value>, "gelu_forward_kernel", grid, dim3(packs::threads), stream, x, y, n);
  });
}
// x, dy, dx: (n)
template <class S>
void gelu_backward(const S* x, const S* dy, S* dx, bool first, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(x, dy, dx), [&](auto w, dim3 grid) {
    launch(gelu_backward_kernel<S, decltype(w)::value>, "gelu_backward_kernel", grid, dim3(packs::threads), stream, x, dy, dx, first, n);
  });
}

// An elementwise op from its element math alone (a user op's kernels):
// F::forward(x) and F::backward(x, dy) -> dx, HEADROOM_HOST_DEVICE, in f32.
// y = F(x);  dx (+)= F'(x) dy.
template <class F, class S, int W>
__global__ void map_forward_kernel(const S* __restrict__ x, S* __restrict__ y, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    float v[decltype(width)::value];
    packs::load(x + i, v);
    for (float& e : v) e = F::forward(e);
    packs::store(y + i, v);
  });
}
template <class F, class S, int W>
__global__ void map_backward_kernel(const S* __restrict__ x, const S* __restrict__ dy, S* __restrict__ dx, bool first,
                                    std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float xv[K], g[K], old[K];
    packs::load(x + i, xv);
    packs::load(dy + i, g);
    if (!first) packs::load(dx + i, old);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      g[k] = F::backward(xv[k], g[k]);
      if (!first) g[k] = old[k] + g[k];
    }
    packs::store(dx + i, g);
  });
}
template <class F, class S>
void map_forward(const S* x, S* y, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(x, y), [&](auto w, dim3 grid) {
    launch(map_forward_kernel<F, S, decltype(w)::value>, "map_forward_kernel", grid, dim3(packs::threads), stream, x, y, n);
  });
}
template <class F, class S>
void map_backward(const S* x, const S* dy, S* dx, bool first, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(x, dy, dx), [&](auto w, dim3 grid) {
    launch(map_backward_kernel<F, S, decltype(w)::value>, "map_backward_kernel", grid, dim3(packs::threads), stream, x, dy, dx,
           first, n);
  });
}

// h = silu(gate) up
template <class S, int W>
__global__ void swiglu_forward_kernel(const S* __restrict__ gate, const S* __restrict__ up, S* __restrict__ h, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float g[K], u[K];
    packs::load(gate + i, g);
    packs::load(up + i, u);
#pragma unroll
    for (int k = 0; k < K; ++k) g[k] = math::swiglu(g[k], u[k]);
    packs::store(h + i, g);
  });
}
// dgate (+)= dh up silu'(gate), dup (+)= dh silu(gate); either may be null
template <class S, int W>
__global__ void swiglu_backward_kernel(const S* __restrict__ gate, const S* __restrict__ up, const S* __restrict__ dh,
                                       S* __restrict__ dgate, bool gate_first, S* __restrict__ dup, bool up_first,
                                       std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float g[K], u[K], d[K], dg[K], du[K], old[K];
    packs::load(gate + i, g);
    packs::load(up + i, u);
    packs::load(dh + i, d);
#pragma unroll
    for (int k = 0; k < K; ++k) math::swiglu_backward(g[k], u[k], d[k], dg[k], du[k]);
    if (dgate != nullptr) {
      if (!gate_first) {
        packs::load(dgate + i, old);
#pragma unroll
        for (int k = 0; k < K; ++k) dg[k] = old[k] + dg[k];
      }
      packs::store(dgate + i, dg);
    }
    if (dup != nullptr) {
      if (!up_first) {
        packs::load(dup + i, old);
#pragma unroll
        for (int k = 0; k < K; ++k) du[k] = old[k] + du[k];
      }
      packs::store(dup + i, du);
    }
  });
}

// gate, up, h: (n)
template <class S>
void swiglu_forward(const S* gate, const S* up, S* h, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(gate, up, h), [&](auto w, dim3 grid) {
    launch(swiglu_forward_kernel<S, decltype(w)::value>, "swiglu_forward_kernel", grid, dim3(packs::threads), stream, gate, up, h, n);
  });
}
// gate, up, dh, dgate, dup: (n); dgate / dup may be null
template <class S>
void swiglu_backward(const S* gate, const S* up, const S* dh, S* dgate, bool gate_first, S* dup, bool up_first, std::int64_t n,
                     cudaStream_t stream) {
  if (dgate == nullptr && dup == nullptr) return;
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(gate, up, dh, dgate, dup), [&](auto w, dim3 grid) {
    launch(swiglu_backward_kernel<S, decltype(w)::value>, "swiglu_backward_kernel", grid, dim3(packs::threads), stream, gate, up, dh, dgate, gate_first,
           dup, up_first, n);
  });
}

// ---- residual add, accumulation, casts -----------------------------------------------------------------------------

// y = a + b
template <class S, int W>
__global__ void add_forward_kernel(const S* __restrict__ a, const S* __restrict__ b, S* __restrict__ y, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float u[K], v[K];
    packs::load(a + i, u);
    packs::load(b + i, v);
#pragma unroll
    for (int k = 0; k < K; ++k) u[k] += v[k];
    packs::store(y + i, u);
  });
}
// dx (+)= dy (first: a copy)
template <class S, int W>
__global__ void accumulate_kernel(const S* __restrict__ dy, S* __restrict__ dx, bool first, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float g[K], old[K];
    packs::load(dy + i, g);
    if (!first) {
      packs::load(dx + i, old);
#pragma unroll
      for (int k = 0; k < K; ++k) g[k] = old[k] + g[k];
    }
    packs::store(dx + i, g);
  });
}
// x *= s
template <class S, int W>
__global__ void scale_kernel(S* __restrict__ x, float s, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float v[K];
    packs::load(x + i, v);
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] *= s;
    packs::store(x + i, v);
  });
}
// y = x converted (rounded to nearest even)
template <class Sin, class Sout, int W>
__global__ void cast_kernel(const Sin* __restrict__ x, Sout* __restrict__ y, std::int64_t n) {
  packs::grid_stride<W>(n, [&](std::int64_t i, auto width) {
    float v[decltype(width)::value];
    packs::load(x + i, v);
    packs::store(y + i, v);
  });
}

// a, b, y: (n)
template <class S>
void add_forward(const S* a, const S* b, S* y, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(a, b, y), [&](auto w, dim3 grid) {
    launch(add_forward_kernel<S, decltype(w)::value>, "add_forward_kernel", grid, dim3(packs::threads), stream, a, b, y, n);
  });
}
// dy, dx: (n)
template <class S>
void accumulate(const S* dy, S* dx, bool first, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::all_aligned(dy, dx), [&](auto w, dim3 grid) {
    launch(accumulate_kernel<S, decltype(w)::value>, "accumulate_kernel", grid, dim3(packs::threads), stream, dy, dx, first, n);
  });
}
// x: (n) *= s (the data-parallel average: a sum over ranks times 1 / ranks)
template <class S>
void scale(S* x, float s, std::int64_t n, cudaStream_t stream) {
  packs::elementwise<packs::width<S>>(n, packs::aligned(x), [&](auto w, dim3 grid) {
    launch(scale_kernel<S, decltype(w)::value>, "scale_kernel", grid, dim3(packs::threads), stream, x, s, n);
  });
}
// x: (n) Sin -> y: (n) Sout, e.g. f32 master weights -> bf16 weights
template <class Sin, class Sout>
void cast(const Sin* x, Sout* y, std::int64_t n, cudaStream_t stream) {
  constexpr int W = packs::width<Sin> < packs::width<Sout> ? packs::width<Sin> : packs::width<Sout>;
  packs::elementwise<W>(n, packs::all_aligned(x, y), [&](auto w, dim3 grid) {
    launch(cast_kernel<Sin, Sout, decltype(w)::value>, "cast_kernel", grid, dim3(packs::threads), stream, x, y, n);
  });
}

}  // namespace headroom::cuda
