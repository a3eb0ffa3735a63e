#pragma once
// The GEMMs of a frozen quantized projection (Quantized<Q, L>: NF4, NF4 with
// double quantization, Int4, Int8; layout in math/quant_view.hpp) with the
// dequantization fused in: each K-step dequantizes a 64 x 64 tile of W into
// shared memory, rounded to the storage type, right before it feeds the
// product, so the dequantized matrix never exists in global memory (the CUDA
// plan reserves no quantized-linear scratch).
//
//   forward:        y (N, Out) = x (N, In) deq(W)^T (+ bias), overwritten
//   backward input: dx (N, In) (+)= dy (N, Out) deq(W)
//
// Same numbers as the host engine (host/kernels/linear.hpp, dequantize_rows):
// an element is code value x absmax (NF4) or code x (absmax / qmax) (Int4,
// Int8) in f32, rounded to S (for bf16: bitsandbytes' "dequantize to bf16,
// then matmul"); products accumulate in f32; the result (+ bias, + the old dx)
// is rounded to S once.
//
// One block computes a 64 x 64 tile of the output with 4 warps, K-steps of 64:
// bf16 / f16 through nvcuda::wmma 16x16x16 fragments with f32 accumulators
// (each warp a 32 x 32 quarter), f32 with SIMT FMAs (exact f32, each thread
// 8 x 4 outputs). A tile of W is W[r0 .. r0+64) x [c0 .. c0+64) with c0 a
// multiple of 64: in the forward pass its rows are output columns (a col-major
// B operand), in the backward pass its rows are the K dimension (row-major B).
// Each thread dequantizes 32 consecutive elements of one row, which lie in one
// quant block, so it reads one absmax per K-step.
//
// Requirements: q.block a multiple of 32 (the formats of core/quant_format.hpp
// use 64), hence In too; codes 4-byte aligned (they are read as 32-bit words).
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "../../core/quant_format.hpp"
#include "../../math/blockwise_int.hpp"
#include "../../math/quant_view.hpp"
#include "../device.cuh"

namespace headroom::cuda {

namespace quant_linear_detail {

inline constexpr int tile = 64;            // output tile edge and K-step
inline constexpr int threads = 128;        // 4 warps
inline constexpr int run = 32;             // consecutive W elements one thread dequantizes per K-step
inline constexpr int accum_ld = tile + 4;  // f32 staging of the wmma accumulators

// Row stride of the shared tiles: wmma wants a multiple of 8 16-bit elements
// (and 32-byte aligned fragment rows); the f32 SIMT path pads by one to keep
// column walks free of bank conflicts.
template <class S>
inline constexpr int tile_ld = std::is_same_v<S, float> ? tile + 1 : tile + 8;

// Fills the 16 values a 4-bit code stands for (before the scale): NF4's code
// table, or the sign-extended Int4 nibble. Int formats have no table.
__device__ inline void fill_code_values(const math::QuantView& w, float* values) {
  if (threadIdx.x < 16) {
    const int nib = static_cast<int>(threadIdx.x);
    values[nib] = w.q.kind == QuantKind::nf4 ? w.table[nib] : static_cast<float>(nib >= 8 ? nib - 16 : nib);
  }
}

// tile[r][c] = src[(row0 + r) ld + col0 + c] for r, c < 64; zero outside (rows, cols).
// src: (rows, cols) row-major with stride ld   tile: (64, LD)
template <class S, int LD>
__device__ inline void load_tile(const S* src, std::int64_t ld, std::int64_t row0, std::int64_t col0, std::int64_t rows,
                                 std::int64_t cols, S* tile_out) {
  for (int e = threadIdx.x; e < tile * tile; e += threads) {
    const int r = e / tile, c = e % tile;
    const bool inside = row0 + r < rows && col0 + c < cols;
    tile_out[r * LD + c] = inside ? src[(row0 + r) * ld + col0 + c] : from_float<S>(0.0f);
  }
}

// tile[r][c] = S(deq(W)[r0 + r][c0 + c]) for r, c < 64 (zero outside W).
// Thread t dequantizes row t / 2, columns [32 (t % 2), 32 (t % 2) + 32): one
// quant block (block is a multiple of 32 and so is c0), one absmax.
// values: the 16 4-bit code values (fill_code_values)   tile: (64, LD)
template <class S, int LD>
__device__ inline void dequantize_tile(const math::QuantView& w, std::int64_t r0, std::int64_t c0, const float* values,
                                       S* tile_out) {
  const int r = threadIdx.x / 2, c = (threadIdx.x % 2) * run;
  S* out = tile_out + r * LD + c;
  if (r0 + r >= w.rows || c0 + c >= w.cols) {
    for (int i = 0; i < run; ++i) out[i] = from_float<S>(0.0f);
    return;
  }
  const std::int64_t first = (r0 + r) * w.cols + c0 + c;  // element index, a multiple of 32
  const float absmax = w.block_absmax(first / w.q.block);
  if (w.q.bits == 4) {
    const float scale = w.q.kind == QuantKind::nf4 ? absmax : absmax / math::IntFormat<4>::qmax;
    const auto* words = reinterpret_cast<const std::uint32_t*>(w.codes + first / 2);  // 16 bytes
#pragma unroll
    for (int k = 0; k < run / 8; ++k) {
      const std::uint32_t word = words[k];
#pragma unroll
      for (int b = 0; b < 4; ++b) {  // little-endian bytes; element 2j in the high nibble
        const unsigned byte = (word >> (8 * b)) & 0xffu;
        out[8 * k + 2 * b] = from_float<S>(values[byte >> 4] * scale);
        out[8 * k + 2 * b + 1] = from_float<S>(values[byte & 15u] * scale);
      }
    }
  } else {
    const float scale = absmax / math::IntFormat<8>::qmax;
    const auto* words = reinterpret_cast<const std::uint32_t*>(w.codes + first);  // 32 bytes
#pragma unroll
    for (int k = 0; k < run / 4; ++k) {
      const std::uint32_t word = words[k];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const auto code = static_cast<std::int8_t>(static_cast<std::uint8_t>((word >> (8 * b)) & 0xffu));
        out[4 * k + b] = from_float<S>(static_cast<float>(code) * scale);
      }
    }
  }
}

// c[m][j] = S(v + bias[j] (+ c[m][j])) for an output element inside (n, ncols).
template <class S>
__device__ inline void store_output(S* c, const S* bias, bool accumulate, std::int64_t ncols, std::int64_t m,
                                    std::int64_t j, float v) {
  if (bias != nullptr) v += to_float(bias[j]);
  S& dst = c[m * ncols + j];
  if (accumulate) v += to_float(dst);
  dst = from_float<S>(v);
}

// C (n, ncols) = A (n, K) B (+ bias) (+ C), B = deq(W)^T (forward: K = In,
// ncols = Out) or deq(W) (Backward: K = Out, ncols = In).
// grid: (ceil(ncols / 64), ceil(n / 64)), block: 128 threads.
template <class S, bool Backward>
__global__ void __launch_bounds__(threads)
    quant_gemm_kernel(const S* a, math::QuantView w, const S* bias, S* c, bool accumulate, std::int64_t n) {
  constexpr bool simt = std::is_same_v<S, float>;
  constexpr int ld = tile_ld<S>;
  alignas(32) __shared__ S a_tile[tile * ld];  // rows m0.., K columns k0..
  alignas(32) __shared__ S w_tile[tile * ld];  // W[r0 + r][c0 + c]
  alignas(32) __shared__ float accum[simt ? 1 : tile * accum_ld];
  __shared__ float code_values[16];

  const std::int64_t k_total = Backward ? w.rows : w.cols, ncols = Backward ? w.cols : w.rows;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * tile, j0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  fill_code_values(w, code_values);
  __syncthreads();

  if constexpr (simt) {
    // thread (ty, tx): rows ty + 8 i, columns tx + 16 j
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[8][4] = {};
    for (std::int64_t k0 = 0; k0 < k_total; k0 += tile) {
      load_tile<S, ld>(a, k_total, m0, k0, n, k_total, a_tile);
      if constexpr (Backward) dequantize_tile<S, ld>(w, k0, j0, code_values, w_tile);
      else dequantize_tile<S, ld>(w, j0, k0, code_values, w_tile);
      __syncthreads();
      for (int k = 0; k < tile; ++k) {
        float av[8], bv[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) av[i] = a_tile[(ty + 8 * i) * ld + k];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = Backward ? w_tile[k * ld + tx + 16 * j] : w_tile[(tx + 16 * j) * ld + k];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
      __syncthreads();
    }
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) {
        const std::int64_t m = m0 + ty + 8 * i, col = j0 + tx + 16 * j;
        if (m < n && col < ncols) store_output(c, bias, accumulate, ncols, m, col, acc[i][j]);
      }
  } else {
    namespace wmma = nvcuda::wmma;
    using BLayout = std::conditional_t<Backward, wmma::row_major, wmma::col_major>;
    const int warp = threadIdx.x / warp_size;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // this warp's 32 x 32 quarter
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (std::int64_t k0 = 0; k0 < k_total; k0 += tile) {
      load_tile<S, ld>(a, k_total, m0, k0, n, k_total, a_tile);
      if constexpr (Backward) dequantize_tile<S, ld>(w, k0, j0, code_values, w_tile);
      else dequantize_tile<S, ld>(w, j0, k0, code_values, w_tile);
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < tile; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, S, BLayout> fb[2];
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], a_tile + (wm + 16 * i) * ld + kk, ld);
        for (int j = 0; j < 2; ++j) {
          // element (k, col) of B: w_tile[k][col] (Backward, row-major) or w_tile[col][k] (col-major)
          const S* b = Backward ? w_tile + kk * ld + wn + 16 * j : w_tile + (wn + 16 * j) * ld + kk;
          wmma::load_matrix_sync(fb[j], b, ld);
        }
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(accum + (wm + 16 * i) * accum_ld + wn + 16 * j, acc[i][j], accum_ld, wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < tile * tile; e += threads) {
      const int r = e / tile, col = e % tile;
      if (m0 + r < n && j0 + col < ncols) store_output(c, bias, accumulate, ncols, m0 + r, j0 + col, accum[r * accum_ld + col]);
    }
  }
}

template <class S, bool Backward>
void launch_quant_gemm(const S* a, const math::QuantView& w, const S* bias, S* c, bool accumulate, std::int64_t n,
                       cudaStream_t stream) {
  if (w.q.kind == QuantKind::none || w.q.block % run != 0)
    throw std::invalid_argument("cuda::quant_linear: needs a quantized format with a block a multiple of 32");
  const std::int64_t ncols = Backward ? w.cols : w.rows;
  if (n <= 0 || ncols <= 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(ncols, tile)), static_cast<unsigned>(ceil_div(n, tile)));
  launch(quant_gemm_kernel<S, Backward>, "quant_gemm_kernel", grid, dim3(threads), stream, a, w, bias, c, accumulate, n);
}

}  // namespace quant_linear_detail

// y (N, Out) = x (N, In) deq(W)^T (+ bias), overwritten.
// x: (N, In)  w: (Out, In) codes  bias: (Out) or null  y: (N, Out)
template <class S>
void quant_linear_forward(const S* x, const math::QuantView& w, const S* bias, S* y, std::int64_t n, cudaStream_t stream) {
  quant_linear_detail::launch_quant_gemm<S, false>(x, w, bias, y, false, n, stream);
}

// dx (N, In) (+)= dy (N, Out) deq(W): overwritten when dx_first, else added to.
// dy: (N, Out)  w: (Out, In) codes  dx: (N, In)
template <class S>
void quant_linear_backward_input(const S* dy, const math::QuantView& w, S* dx, bool dx_first, std::int64_t n,
                                 cudaStream_t stream) {
  quant_linear_detail::launch_quant_gemm<S, true>(dy, w, nullptr, dx, !dx_first, n, stream);
}

}  // namespace headroom::cuda
