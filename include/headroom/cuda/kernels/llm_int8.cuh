#pragma once
// LLM.int8's forward on the GPU (the algorithm: math/llm_int8.hpp; the
// host's reference: host::llm_int8_forward), four kernels on one stream:
//
//   1. mark_columns      marks[j] = 1 where some row has |x[i, j]| >= threshold
//   2. list_columns      the marked columns in increasing order (one block,
//                        a prefix sum: deterministic), their count in count[0]
//   3. quantize_rows     s_i = absmax of row i over the unmarked columns,
//                        xq[i, j] = round_half_even(x[i, j] * 127 / s_i), 0 where marked
//   4. int8_gemm         y = float(xq cb^T, int32 sums) * (s_i a_o) / 127^2
//                          + the marked columns' f32 product, then S, then + bias
//
// y matches host::llm_int8_forward bit for bit: each output element is the
// same f32 operations in the same order (the int32 sum, its scaling, the
// outlier terms added in increasing column order, each product rounded
// before its sum: no FMA), rounded to S, then the bias added and rounded.
//
// More outlier columns than the plan's bound (QuantDesc::max_outliers):
// count[0] holds how many (the list only the first `bound`), no kernel reads
// past the list, y is NaN (so that every other process of a parallel run
// sees a non-finite loss and stops too), and when the trainer's control
// block is given the step is stopped: control->skip = 1 (no update runs)
// and, for the first such projection of the step, control->outliers_found
// and control->outlier_step, which the trainer reads at the end of the step
// (it then throws outlier_bound_exceeded naming the layer). Nothing here
// waits for the host, so a captured CUDA graph replays it as it is.
//
// Scratch: math::int8_scratch(n, in, bound) bytes (the op's forward scratch).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "../../core/quant_format.hpp"
#include "../../math/llm_int8.hpp"
#include "../../math/quant_view.hpp"
#include "../device.cuh"
#include "optimizer.cuh"

namespace headroom::cuda {

namespace llm_int8_detail {

inline constexpr int mark_threads = 256;      // 32 columns x 8 groups of rows
inline constexpr int mark_columns = 32;
inline constexpr int list_threads = 256;      // one block: each thread a run of columns
inline constexpr int quantize_threads = 256;  // one block per row
inline constexpr int tile = 64;               // int8_gemm: output tile edge, and K-step in bytes
inline constexpr int tile_words = tile / 4;   // the K-step in 32-bit words of four codes
inline constexpr int gemm_threads = 128;      // each thread 8 x 4 outputs
inline constexpr int outlier_chunk = 32;      // outlier columns staged in shared memory at a time

// The scratch's parts (math::int8_scratch's layout).
struct Scratch {
  std::int8_t* xq;         // (N, In)
  float* row_scale;        // (N)
  std::int32_t* marks;     // (In)
  std::int32_t* outliers;  // (bound)
  std::int32_t* count;     // (4): [0] the outlier columns found
};
inline Scratch scratch_parts(std::byte* scratch, std::int64_t n, std::int64_t in, std::int64_t bound) {
  const math::Int8Scratch at = math::int8_scratch(n, in, bound);
  return {reinterpret_cast<std::int8_t*>(scratch + at.xq), reinterpret_cast<float*>(scratch + at.row_scale),
          reinterpret_cast<std::int32_t*>(scratch + at.marks), reinterpret_cast<std::int32_t*>(scratch + at.outliers),
          reinterpret_cast<std::int32_t*>(scratch + at.count)};
}

// v + a b with the product rounded first, as the host computes it (nvcc
// would otherwise contract it into one FMA).
__device__ __forceinline__ float add_product(float v, float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(v, __fmul_rn(a, b));
#else
  return v + a * b;
#endif
}

// acc + the dot product of two words of four signed bytes each.
__device__ __forceinline__ std::int32_t dot4(std::int32_t a, std::int32_t b, std::int32_t acc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
  return __dp4a(a, b, acc);
#else
#pragma unroll
  for (int k = 0; k < 4; ++k)
    acc += static_cast<std::int32_t>(static_cast<std::int8_t>(static_cast<std::uint32_t>(a) >> (8 * k))) *
           static_cast<std::int32_t>(static_cast<std::int8_t>(static_cast<std::uint32_t>(b) >> (8 * k)));
  return acc;
#endif
}

// Four consecutive codes row[k .. k + 4) as one word (little-endian: row[k]
// in the low byte), zero past `len`. `aligned`: row + k is 4-byte aligned
// whenever k is a multiple of 4 (then a whole word is one load).
__device__ __forceinline__ std::int32_t load_word(const std::int8_t* row, std::int64_t k, std::int64_t len, bool aligned) {
  if (aligned && k + 4 <= len) return *reinterpret_cast<const std::int32_t*>(row + k);
  std::uint32_t w = 0;
  for (int b = 0; b < 4; ++b)
    if (k + b < len) w |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(row[k + b])) << (8 * b);
  return static_cast<std::int32_t>(w);
}

// ---- 1. the outlier columns' marks ---------------------------------------------------------------------------

// marks[j] = 1 when some |x[i, j]| >= threshold (i < n), else 0; all 0 when
// not decomposed (threshold 0). x: (N, In)  marks: (In)
// grid: ceil(In / 32), block: 256 = 32 columns x 8 groups of rows.
template <class S>
__global__ void __launch_bounds__(mark_threads)
    mark_columns_kernel(const S* __restrict__ x, std::int64_t n, std::int64_t in, float threshold, bool decomposed,
                        std::int32_t* __restrict__ marks) {
  constexpr int groups = mark_threads / mark_columns;
  __shared__ std::int32_t found[groups][mark_columns];
  const int c = threadIdx.x % mark_columns, g = threadIdx.x / mark_columns;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * mark_columns + c;
  std::int32_t mark = 0;
  if (decomposed && j < in)
    for (std::int64_t i = g; i < n; i += groups) mark |= fabsf(to_float(x[i * in + j])) >= threshold ? 1 : 0;
  found[g][c] = mark;
  __syncthreads();
  if (g == 0 && j < in) {
    for (int h = 1; h < groups; ++h) mark |= found[h][c];
    marks[j] = mark;
  }
}

// ---- 2. the increasing list of outlier columns ----------------------------------------------------------------

// outliers[0 .. min(count, bound)) = the marked columns in increasing order,
// count[0] = how many are marked. One block: thread t lists the columns of
// its run [t r, (t + 1) r), r = ceil(In / 256), from the exclusive prefix
// sum of the runs' counts. Above the bound, the step is stopped (control,
// when given: see the top of this file).
// marks: (In)  outliers: (bound)  count: (4)
template <int = 0>
__global__ void __launch_bounds__(list_threads)
    list_columns_kernel(const std::int32_t* __restrict__ marks, std::int64_t in, std::int32_t bound,
                        std::int32_t* __restrict__ outliers, std::int32_t* __restrict__ count, UpdateControl* control,
                        std::int32_t schedule_step) {
  __shared__ std::int32_t scan[2][list_threads];  // an inclusive prefix sum of the runs' counts, double-buffered
  const int t = threadIdx.x;
  const std::int64_t run = (in + list_threads - 1) / list_threads;
  const std::int64_t begin = t * run < in ? t * run : in, end = begin + run < in ? begin + run : in;
  std::int32_t own = 0;
  for (std::int64_t j = begin; j < end; ++j) own += marks[j] != 0 ? 1 : 0;
  int from = 0;
  scan[from][t] = own;
  __syncthreads();
  for (int d = 1; d < list_threads; d *= 2) {  // Hillis-Steele
    scan[1 - from][t] = scan[from][t] + (t >= d ? scan[from][t - d] : 0);
    from = 1 - from;
    __syncthreads();
  }
  std::int32_t at = scan[from][t] - own;  // columns listed before this run
  for (std::int64_t j = begin; j < end && at < bound; ++j)
    if (marks[j] != 0) outliers[at++] = static_cast<std::int32_t>(j);
  if (t == list_threads - 1) {
    const std::int32_t found = scan[from][t];
    count[0] = found;
    if (found > bound && control != nullptr) {
      control->skip = 1.0f;  // no update runs this step
      if (control->outliers_found == 0) {  // the step's first refused projection names the error
        control->outliers_found = found;
        control->outlier_step = schedule_step;
      }
    }
  }
}

// ---- 3. the rows in int8 ---------------------------------------------------------------------------------------

// s_i = max |x[i, j]| over the unmarked columns; xq[i, j] its code (0 where
// marked). One block per row; nothing when the batch is refused.
// x: (N, In)  marks: (In)  xq: (N, In)  row_scale: (N)
template <class S>
__global__ void __launch_bounds__(quantize_threads)
    quantize_rows_kernel(const S* __restrict__ x, const std::int32_t* __restrict__ marks, const std::int32_t* __restrict__ count,
                         std::int32_t bound, std::int64_t in, std::int8_t* __restrict__ xq, float* __restrict__ row_scale) {
  __shared__ float reduce[warp_size];
  if (count[0] > bound) return;  // the same for every thread of the block
  const std::int64_t i = blockIdx.x;
  const S* row = x + i * in;
  float s = 0.0f;
  for (std::int64_t j = threadIdx.x; j < in; j += quantize_threads)
    if (marks[j] == 0) {
      const float v = fabsf(to_float(row[j]));
      s = v > s ? v : s;
    }
  s = block_max<quantize_threads>(s, reduce);
  const float inv = math::int8_inverse_scale(s);
  for (std::int64_t j = threadIdx.x; j < in; j += quantize_threads)
    xq[i * in + j] = marks[j] == 0 ? math::int8_input_code(to_float(row[j]), inv) : std::int8_t{0};
  if (threadIdx.x == 0) row_scale[i] = s;
}

// ---- 4. the int8 product with its f32 outlier columns ------------------------------------------------------------

// y[i, o] = S(float(sum_j xq[i, j] cb[o, j]) * (s_i a_o) / 127^2
//             + sum_k x[i, c_k] * (cb[o, c_k] * (a_o / 127)))   (c_k = outliers[k], increasing)
// then y[i, o] = S(y[i, o] + bias[o]) with a bias. A block computes a 64 x 64
// tile of y: K-steps of 64 codes as 16 words per row in shared memory, each
// thread rows ty + 8 r and columns tx + 16 c of the tile (int32 sums); then
// the outlier columns, 32 at a time: the tile's rows of x and the tile's
// output rows of W (dequantized) in shared memory. A refused batch: y = NaN.
// x: (N, In) S  xq: (N, In)  row_scale: (N)  w: (Out, In) int8 codes, one absmax per row
// outliers: (bound)  count: (4)  bias: (Out) or null  y: (N, Out)
// grid: (ceil(Out / 64), ceil(N / 64)), block: 128 threads.
template <class S>
__global__ void __launch_bounds__(gemm_threads)
    int8_gemm_kernel(const S* __restrict__ x, const std::int8_t* __restrict__ xq, const float* __restrict__ row_scale,
                     math::QuantView w, const std::int32_t* __restrict__ outliers, const std::int32_t* __restrict__ count,
                     std::int32_t bound, const S* __restrict__ bias, S* __restrict__ y, std::int64_t n, bool aligned) {
  __shared__ std::int32_t x_words[tile][tile_words + 1];  // rows m0 .., codes k0 .. k0 + 64
  __shared__ std::int32_t w_words[tile][tile_words + 1];  // W's rows o0 .., codes k0 .. k0 + 64
  __shared__ float x_out[tile][outlier_chunk + 1];        // x[m0 + r][c_k]
  __shared__ float w_out[tile][outlier_chunk + 1];        // deq(W)[o0 + r][c_k]

  const std::int64_t in = w.cols, out = w.rows;
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * tile, o0 = static_cast<std::int64_t>(blockIdx.x) * tile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const std::int32_t found = count[0];
  if (found > bound) {  // refused: no list to read
    for (int e = threadIdx.x; e < tile * tile; e += gemm_threads) {
      const std::int64_t m = m0 + e / tile, o = o0 + e % tile;
      if (m < n && o < out) y[m * out + o] = from_float<S>(std::numeric_limits<float>::quiet_NaN());
    }
    return;
  }
  const auto* codes = reinterpret_cast<const std::int8_t*>(w.codes);

  std::int32_t acc[8][4] = {};
  for (std::int64_t k0 = 0; k0 < in; k0 += tile) {
    for (int e = threadIdx.x; e < tile * tile_words; e += gemm_threads) {
      const int r = e / tile_words, kw = e % tile_words;
      const std::int64_t k = k0 + 4 * kw;
      x_words[r][kw] = m0 + r < n ? load_word(xq + (m0 + r) * in, k, in, aligned) : 0;
      w_words[r][kw] = o0 + r < out ? load_word(codes + (o0 + r) * in, k, in, aligned) : 0;
    }
    __syncthreads();
#pragma unroll 4
    for (int kw = 0; kw < tile_words; ++kw) {
      std::int32_t a[8], b[4];
#pragma unroll
      for (int r = 0; r < 8; ++r) a[r] = x_words[ty + 8 * r][kw];
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = w_words[tx + 16 * c][kw];
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = dot4(a[r], b[c], acc[r][c]);
    }
    __syncthreads();
  }

  // the int8 product dequantized, then the outlier columns in increasing order
  float v[8][4];
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 4; ++c) {
      const std::int64_t m = m0 + ty + 8 * r, o = o0 + tx + 16 * c;
      v[r][c] = m < n && o < out ? static_cast<float>(acc[r][c]) * (row_scale[m] * w.block_absmax(o)) * math::int8_dequant : 0.0f;
    }
  for (std::int32_t k0 = 0; k0 < found; k0 += outlier_chunk) {
    const int chunk = found - k0 < outlier_chunk ? found - k0 : outlier_chunk;
    for (int e = threadIdx.x; e < tile * outlier_chunk; e += gemm_threads) {
      const int r = e / outlier_chunk, k = e % outlier_chunk;
      const std::int64_t j = k < chunk ? outliers[k0 + k] : 0;
      x_out[r][k] = k < chunk && m0 + r < n ? to_float(x[(m0 + r) * in + j]) : 0.0f;
      w_out[r][k] = k < chunk && o0 + r < out
                        ? static_cast<float>(codes[(o0 + r) * in + j]) * (w.block_absmax(o0 + r) / math::int8_qmax)
                        : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < chunk; ++k)
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) v[r][c] = add_product(v[r][c], x_out[ty + 8 * r][k], w_out[tx + 16 * c][k]);
    __syncthreads();
  }

  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 4; ++c) {
      const std::int64_t m = m0 + ty + 8 * r, o = o0 + tx + 16 * c;
      if (m >= n || o >= out) continue;
      S value = from_float<S>(v[r][c]);
      if (bias != nullptr) value = from_float<S>(to_float(value) + to_float(bias[o]));
      y[m * out + o] = value;
    }
}

}  // namespace llm_int8_detail

// y (N, Out) = LLM.int8's product of x (N, In) and the row-wise int8 W
// (+ bias), overwritten (see the top of this file). scratch: the op's
// forward scratch, math::int8_scratch(N, In, w.q.max_outliers) bytes.
// control / schedule_step: the trainer's control block and the event's
// schedule step, where a refused batch stops the step (null: only
// count[0] and the NaN output tell).
// x: (N, In)  w: (Out, In) codes  bias: (Out) or null  y: (N, Out)
template <class S>
void llm_int8_forward(const S* x, const math::QuantView& w, const S* bias, S* y, std::int64_t n, std::byte* scratch,
                      UpdateControl* control, int schedule_step, cudaStream_t stream) {
  using namespace llm_int8_detail;
  if (w.q.kind != QuantKind::int8 || !w.q.vectorwise || w.q.block != w.cols)
    throw std::invalid_argument("cuda::llm_int8_forward: needs an LLM.int8 weight (LLMInt8<>: int8, one absmax per row)");
  if (scratch == nullptr)
    throw std::invalid_argument("cuda::llm_int8_forward: needs the op's forward scratch (math::int8_scratch: " +
                                std::to_string(math::int8_scratch(n, w.cols, w.q.max_outliers).bytes) + " bytes)");
  const std::int64_t in = w.cols, out = w.rows;
  if (n <= 0 || out <= 0 || in <= 0) return;
  const std::int32_t bound = w.q.max_outliers;
  const Scratch s = scratch_parts(scratch, n, in, bound);
  launch(mark_columns_kernel<S>, "llm_int8 mark_columns_kernel", dim3(static_cast<unsigned>(ceil_div(in, mark_columns))),
         dim3(mark_threads), stream, x, n, in, w.q.outlier_threshold, w.q.decomposed(), s.marks);
  launch(list_columns_kernel<>, "llm_int8 list_columns_kernel", dim3(1), dim3(list_threads), stream, s.marks, in, bound,
         s.outliers, s.count, control, static_cast<std::int32_t>(schedule_step));
  launch(quantize_rows_kernel<S>, "llm_int8 quantize_rows_kernel", dim3(static_cast<unsigned>(n)), dim3(quantize_threads), stream,
         x, s.marks, s.count, bound, in, s.xq, s.row_scale);
  // whole words where every row of xq and of the codes starts 4-byte aligned
  const bool aligned = in % 4 == 0 && reinterpret_cast<std::uintptr_t>(s.xq) % 4 == 0 &&
                       reinterpret_cast<std::uintptr_t>(w.codes) % 4 == 0;
  const dim3 grid(static_cast<unsigned>(ceil_div(out, tile)), static_cast<unsigned>(ceil_div(n, tile)));
  launch(int8_gemm_kernel<S>, "llm_int8 int8_gemm_kernel", grid, dim3(gemm_threads), stream, x, s.xq, s.row_scale, w, s.outliers,
         s.count, bound, bias, y, n, aligned);
}

}  // namespace headroom::cuda
