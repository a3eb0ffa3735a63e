#pragma once
// Causal self-attention on the GPU, flash style (FlashAttention-2, Dao 2023,
// arXiv:2307.08691): the CUDA twin of host/attention.hpp, same formulas, same
// layouts, no (seq, seq) array anywhere.
//
//   forward   blocks over (query tile, head, batch), heaviest tiles first. The
//             query tile stays in shared memory while the key / value tiles at
//             or before it stream through; each warp owns 16 query rows, with a
//             running max and sum per row (math::OnlineSoftmax) and its output
//             rows in registers. Writes o and lse = m + log(l) (f32).
//   backward  three launches:
//             delta = rowsum(dO * O): (B, H, T) f32, the caller's scratch;
//             dK, dV: blocks over (key tile, kv head, batch), looping over the
//               group's query heads and the query tiles at or after the key tile;
//             dQ: blocks over (query tile, head, batch), looping over key tiles.
//             Both recompute P = exp(S - lse) and dS = P (dP - delta) tile by
//             tile; every element of dq, dk, dv has one writer (no atomics, no
//             f32 accumulator in global memory), and is overwritten.
//
// Sliding window (Mistral; d.window = W > 0): query position p attends to key
// positions p - W + 1 .. p only. Key tiles before the window of a block's
// first query row are never loaded (forward, dQ: the key loop starts at the
// tile holding that row's window start), query tiles past the window of a
// block's last key are never loaded (dK, dV: the query loop stops at the tile
// holding the last query that reaches it), and a warp skips the tiles or
// 16x16 blocks its rows' windows miss; the blocks that straddle the window's
// edge are masked element by element. The work is about seq * W, not seq^2 / 2.
//
// Products, one warp per 16x16 output block (WarpTile):
//   S = Q K^T, O += P V, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K.
//   16-bit storage (bf16, f16): all six on tensor cores (nvcuda::wmma 16x16x16,
//   f32 accumulators); Q, K, V, dO tiles are in the storage type and P, dS are
//   rounded to it before their products. float storage: the same tiling with
//   f32 FMAs (SIMT). Softmax statistics, scaling and RoPE are f32.
//
// RoPE (math/rope.hpp's rotation: element i pairs with i + hd/2, inv_freq_i =
// theta^(-2i/hd)) rotates q and k as their tiles load, at their positions t;
// the backward returns gradients of the un-rotated q and k (the inverse
// rotation of the gradients of the rotated ones). math::rope_rotate walks a
// whole vector and recomputes pow per element; here each thread rotates one
// pair, with inv_freq from a per-block table computed in double as the host
// does (host::detail::rope_inv_freq), the angle p * inv_freq reduced modulo
// 2 pi in double, and its sine and cosine in f32.
//
// Tiles (Tiles<S>): 16-bit storage, 4 warps, forward 64 query rows against
// 32-key tiles, backward 32 x 32; float, 2 warps, 32 x 16 and 16 x 16 (f32
// tiles take twice the bytes). Tiles load with 4-element vector accesses where
// the pointer and row stride allow (else element by element), zero-padded to
// whole 16x16 blocks.
//
// Limits: head_dim a multiple of 8, at most 128 (the shared tiles are sized for
// 128; the launchers throw std::invalid_argument otherwise). Shared memory is
// static, under 48 KiB per block (ForwardSmem, BackwardSmem).
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../../math/attention_window.hpp"
#include "../../math/rope.hpp"
#include "../../math/softmax.hpp"
#include "../device.cuh"

namespace headroom::cuda {

struct AttentionShape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;  // GQA: query head h reads kv head h / (heads / kv_heads)
  bool rope;                                           // rotate q and k (math/rope.hpp convention) at their positions
  float rope_theta;
  math::RopeScaling rope_scaling{};                    // Llama 3.1's, when on()
  std::int64_t window = 0;                             // sliding window: position p attends to p - window + 1 .. p; 0: none
};

inline constexpr std::int64_t attention_max_head_dim = 128;

// f32 elements of attention_backward's scratch: delta = rowsum(dO * O), (batch, heads, seq).
constexpr std::int64_t attention_backward_scratch_floats(const AttentionShape& d) { return d.batch * d.heads * d.seq; }

namespace attention_detail {

using i64 = std::int64_t;

inline constexpr int max_hd = static_cast<int>(attention_max_head_dim);
inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// Tile sizes per storage type. Every warp computes 16x16 blocks; a 16-bit
// tile row is padded by 16 bytes (rows start in different banks, and wmma's
// leading dimension stays a multiple of 16 bytes).
template <class S>
struct Tiles {
  static constexpr bool tensor_cores = !std::is_same_v<S, float>;
  static constexpr int warps = tensor_cores ? 4 : 2;
  static constexpr int threads = warps * warp_size;
  static constexpr int fwd_rows = 16 * warps;              // query rows of a forward block (16 per warp)
  static constexpr int fwd_keys = tensor_cores ? 32 : 16;  // keys of a forward key / value tile
  static constexpr int bwd_rows = tensor_cores ? 32 : 16;  // query rows of a backward tile
  static constexpr int bwd_keys = bwd_rows;                // keys of a backward tile
  static constexpr int pad = 16 / static_cast<int>(sizeof(S));
  static constexpr int ld = max_hd + pad;  // row stride of a (rows, head_dim) tile in S
  static constexpr int ldf = max_hd + 4;   // row stride of a (rows, head_dim) f32 staging tile
};

// A warp's 16 rows of an A operand, (16, k) row-major with k <= K, held
// across WarpTile::mma calls: wmma fragments for 16-bit S; for float, where
// the rows are in shared memory (SIMT products read them from there).
template <class S, int K>
struct WarpRows {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, S, nvcuda::wmma::row_major> f[K / 16];

  // a: (16, k), rows lda apart; k a multiple of 16
  __device__ void load(const S* a, int lda, int k) {
#pragma unroll
    for (int i = 0; i < K / 16; ++i)
      if (i * 16 < k) nvcuda::wmma::load_matrix_sync(f[i], a + i * 16, lda);
  }
};

template <int K>
struct WarpRows<float, K> {
  const float* a;
  int lda;

  __device__ void load(const float* rows, int ld, int) {
    a = rows;
    lda = ld;
  }
};

// One warp's 16x16 f32 block C (+)= A B, A: (16, k), B: (k, 16), k a multiple
// of 16, both in shared memory. RowA: A[i][j] = a[i * lda + j], else
// a[i + j * lda] (col-major, e.g. P^T read from P); RowB likewise for B.
// 16-bit S: wmma fragments (a, b, lda, ldb 32-byte aligned / multiples of 8).
template <class S>
struct WarpTile {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> c;

  __device__ void zero() { nvcuda::wmma::fill_fragment(c, 0.0f); }

  template <bool RowA, bool RowB>
  __device__ void mma(const S* a, int lda, const S* b, int ldb, int k) {
    namespace wmma = nvcuda::wmma;
    using LayoutA = std::conditional_t<RowA, wmma::row_major, wmma::col_major>;
    using LayoutB = std::conditional_t<RowB, wmma::row_major, wmma::col_major>;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, S, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, S, LayoutB> fb;
    for (int kk = 0; kk < k; kk += 16) {
      wmma::load_matrix_sync(fa, RowA ? a + kk : a + kk * lda, lda);
      wmma::load_matrix_sync(fb, RowB ? b + kk * ldb : b + kk, ldb);
      wmma::mma_sync(c, fa, fb, c);
    }
  }

  // the same with A held by the warp (WarpRows), k <= K
  template <bool RowB, int K>
  __device__ void mma(const WarpRows<S, K>& a, const S* b, int ldb, int k) {
    namespace wmma = nvcuda::wmma;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, S, std::conditional_t<RowB, wmma::row_major, wmma::col_major>> fb;
#pragma unroll
    for (int i = 0; i < K / 16; ++i) {
      if (i * 16 < k) {
        wmma::load_matrix_sync(fb, RowB ? b + i * 16 * ldb : b + i * 16, ldb);
        wmma::mma_sync(c, a.f[i], fb, c);
      }
    }
  }

  // out (16, 16), rows ldo apart <- C
  __device__ void store(float* out, int ldo) const {
    nvcuda::wmma::store_matrix_sync(out, c, ldo, nvcuda::wmma::mem_row_major);
  }
};

// float storage: lane l holds row l / 2, columns 8 (l % 2) .. 8 (l % 2) + 7.
template <>
struct WarpTile<float> {
  float c[8];

  __device__ void zero() {
#pragma unroll
    for (int e = 0; e < 8; ++e) c[e] = 0.0f;
  }

  template <bool RowA, bool RowB>
  __device__ void mma(const float* a, int lda, const float* b, int ldb, int k) {
    const int lane = threadIdx.x % warp_size, r = lane / 2, c0 = (lane % 2) * 8;
    for (int kk = 0; kk < k; ++kk) {
      const float x = RowA ? a[r * lda + kk] : a[r + kk * lda];
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] += x * (RowB ? b[kk * ldb + c0 + e] : b[kk + (c0 + e) * ldb]);
    }
  }

  template <bool RowB, int K>
  __device__ void mma(const WarpRows<float, K>& a, const float* b, int ldb, int k) {
    mma<true, RowB>(a.a, a.lda, b, ldb, k);
  }

  __device__ void store(float* out, int ldo) const {
    const int lane = threadIdx.x % warp_size, r = lane / 2, c0 = (lane % 2) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[r * ldo + c0 + e] = c[e];
  }
};

// Where a lane reads a 16x16 f32 block a warp stored: row lane / 2, columns
// lane_col0() .. lane_col0() + 7 (the same split as WarpTile<float>).
__device__ inline int lane_row() { return static_cast<int>(threadIdx.x % warp_size) / 2; }
__device__ inline int lane_col0() { return static_cast<int>(threadIdx.x % warp_size) % 2 * 8; }

template <class U>
__device__ inline U* carve(unsigned char* smem, int offset) {
  return reinterpret_cast<U*>(smem + offset);
}

__device__ inline i64 min64(i64 a, i64 b) { return a < b ? a : b; }

// the first key a query reaches, the last query reaching a key (math/attention_window.hpp)
using math::attention_window_end;
using math::attention_window_start;

// ---------------------------------------------------------------------------
// RoPE. inv_freq: (hd / 2) double, math::rope_inv_freq (as the host's table).
template <int Threads>
__device__ void fill_inv_freq(double* inv_freq, int hd, float theta, const math::RopeScaling& scaling) {
  for (int i = threadIdx.x; i < hd / 2; i += Threads)
    inv_freq[i] = math::rope_inv_freq(i, hd, static_cast<double>(theta), scaling);
}

// (x0, x1) = (x_i, x_{i + hd/2}) of a vector at position pos, rotated by the
// pair's angle a = pos * inv_freq (inverse: by -a), as math::rope_rotate does.
__device__ inline void rope_pair(float& x0, float& x1, double inv_freq, i64 pos, bool inverse) {
  constexpr double two_pi = 6.283185307179586476925286766559, inv_two_pi = 0.15915494309189533576888376337251;
  double a = static_cast<double>(pos) * inv_freq;
  a -= two_pi * floor(a * inv_two_pi);
  float s, c;
  sincosf(static_cast<float>(a), &s, &c);
  if (inverse) s = -s;
  const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
  x0 = y0;
  x1 = y1;
}

// ---------------------------------------------------------------------------
// Tile loads and stores, N consecutive elements per access (a vector access on
// the GPU when N > 1; `pack` when the pointer and row stride allow it).
template <class S, int N>
struct alignas(N * sizeof(S)) Pack {
  S x[N];
};

inline constexpr int pack = 4;

template <class S>
__device__ inline bool packable(const S* p, i64 ld) {
  return reinterpret_cast<std::uintptr_t>(p) % (pack * sizeof(S)) == 0 && ld % pack == 0;
}

// dst: (Rows, Ld) in shared memory <- rows [pos0, pos0 + Rows) of one head;
// src points at row pos0's first column, rows ld_src apart. Rotated to their
// positions when inv_freq is non-null. Rows at or past `valid` and columns
// [hd, hd_pad) are zero (hd_pad: hd rounded up to 16, the products' depth).
// With vector accesses (N > 1) a thread has two loads (four when rotating) in
// flight at a time: more buffers cost occupancy (registers).
template <int N, int Threads, int Rows, int Ld, class S>
__device__ void load_tile_by(S* dst, const S* src, i64 ld_src, int valid, i64 pos0, int hd, int hd_pad,
                             const double* inv_freq) {
  using P = Pack<S, N>;
  P zero;
#pragma unroll
  for (int e = 0; e < N; ++e) zero.x[e] = from_float<S>(0.0f);
  const bool rotate = inv_freq != nullptr;
  const int half = hd / 2;
  // an access unit: N columns (no rotation) or N pairs (i, i + half), of one row
  const int units = rotate ? half / N : hd_pad / N;  // per row
  constexpr int per_thread = (Rows * (max_hd / N) + Threads - 1) / Threads;
  constexpr int batch = N == 1 || per_thread < 2 ? 1 : 2;
#pragma unroll 1
  for (int round = 0; round < per_thread; round += batch) {
    P lo[batch], hi[batch];
#pragma unroll
    for (int j = 0; j < batch; ++j) {
      const int idx = threadIdx.x + (round + j) * Threads, r = idx / units, c = idx % units * N;
      const S* row = src + r * ld_src;
      lo[j] = r < valid && c < hd ? *reinterpret_cast<const P*>(row + c) : zero;
      if (rotate) hi[j] = r < valid ? *reinterpret_cast<const P*>(row + c + half) : zero;
    }
#pragma unroll
    for (int j = 0; j < batch; ++j) {
      const int idx = threadIdx.x + (round + j) * Threads, r = idx / units, c = idx % units * N;
      if (r >= Rows) continue;
      if (rotate && r < valid) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          float x0 = to_float(lo[j].x[e]), x1 = to_float(hi[j].x[e]);
          rope_pair(x0, x1, inv_freq[c + e], pos0 + r, false);
          lo[j].x[e] = from_float<S>(x0);
          hi[j].x[e] = from_float<S>(x1);
        }
      }
      *reinterpret_cast<P*>(dst + r * Ld + c) = lo[j];
      if (rotate) *reinterpret_cast<P*>(dst + r * Ld + c + half) = hi[j];
    }
  }
  if (rotate) {  // columns [hd, hd_pad)
    const int tail = (hd_pad - hd) / N;  // per row
    for (int idx = threadIdx.x; idx < Rows * tail; idx += Threads)
      *reinterpret_cast<P*>(dst + idx / tail * Ld + hd + idx % tail * N) = zero;
  }
}

template <int Threads, int Rows, int Ld, class S>
__device__ void load_tile(S* dst, const S* src, i64 ld_src, int valid, i64 pos0, int hd, int hd_pad,
                          const double* inv_freq) {
  if (packable(src, ld_src)) load_tile_by<pack, Threads, Rows, Ld>(dst, src, ld_src, valid, pos0, hd, hd_pad, inv_freq);
  else load_tile_by<1, Threads, Rows, Ld>(dst, src, ld_src, valid, pos0, hd, hd_pad, inv_freq);
}

// Rows [0, valid) of dst (rows ld_dst apart) <- mul * src_r, rotated back from
// position pos0 + r (the inverse rotation) when inv_freq is non-null.
// src: (valid, ldf) f32 in shared memory.
template <int N, int Threads, class S>
__device__ void store_tile_by(S* dst, i64 ld_dst, const float* src, int ldf, int valid, i64 pos0, int hd,
                              const double* inv_freq, float mul) {
  using P = Pack<S, N>;
  if (inv_freq == nullptr) {
    const int units = hd / N;
    for (int idx = threadIdx.x; idx < valid * units; idx += Threads) {
      const int r = idx / units, c = idx % units * N;
      P out;
#pragma unroll
      for (int e = 0; e < N; ++e) out.x[e] = from_float<S>(src[r * ldf + c + e] * mul);
      *reinterpret_cast<P*>(dst + r * ld_dst + c) = out;
    }
    return;
  }
  const int half = hd / 2, units = half / N;
  for (int idx = threadIdx.x; idx < valid * units; idx += Threads) {
    const int r = idx / units, i = idx % units * N;
    P lo, hi;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float x0 = src[r * ldf + i + e] * mul, x1 = src[r * ldf + i + half + e] * mul;
      rope_pair(x0, x1, inv_freq[i + e], pos0 + r, true);
      lo.x[e] = from_float<S>(x0);
      hi.x[e] = from_float<S>(x1);
    }
    *reinterpret_cast<P*>(dst + r * ld_dst + i) = lo;
    *reinterpret_cast<P*>(dst + r * ld_dst + i + half) = hi;
  }
}

template <int Threads, class S>
__device__ void store_tile(S* dst, i64 ld_dst, const float* src, int ldf, int valid, i64 pos0, int hd,
                           const double* inv_freq, float mul) {
  if (packable(dst, ld_dst)) store_tile_by<pack, Threads>(dst, ld_dst, src, ldf, valid, pos0, hd, inv_freq, mul);
  else store_tile_by<1, Threads>(dst, ld_dst, src, ldf, valid, pos0, hd, inv_freq, mul);
}

// ---------------------------------------------------------------------------
// Shared memory of the forward kernel, byte offsets into one array.
template <class S>
struct ForwardSmem {
  using T = Tiles<S>;
  static constexpr int z = static_cast<int>(sizeof(S));
  static constexpr int pld = T::fwd_keys + T::pad;                       // row stride of P
  static constexpr int q = 0;                                            // Q rotated: (fwd_rows, ld) S
  static constexpr int k = q + T::fwd_rows * T::ld * z;                  // K rotated: (fwd_keys, ld) S
  static constexpr int v = k + T::fwd_keys * T::ld * z;                  // V: (fwd_keys, ld) S
  static constexpr int scores = v + T::fwd_keys * T::ld * z;             // per warp: S (16, fwd_keys) f32, then P V blocks
  static constexpr int p = scores + T::warps * 16 * T::fwd_keys * 4;     // per warp: P (16, pld) S
  static constexpr int inv_freq = p + T::warps * 16 * pld * z;           // RoPE: (max_hd / 2) double
  static constexpr int bytes = inv_freq + max_hd / 2 * 8;
  static_assert(k % 32 == 0 && v % 32 == 0 && scores % 32 == 0 && p % 32 == 0 && (16 * pld * z) % 32 == 0 &&
                    inv_freq % 32 == 0,
                "attention: wmma needs 32-byte aligned tiles");
  static_assert(bytes <= 48 * 1024, "attention: static shared memory is limited to 48 KiB per block");
};

// Shared memory of the two backward kernels (dQ leaves p unused). After the
// loops, dK (or dQ) is staged in f32 over q and dout, dV over k and v.
template <class S>
struct BackwardSmem {
  using T = Tiles<S>;
  static constexpr int z = static_cast<int>(sizeof(S));
  static constexpr int pld = T::bwd_keys + T::pad;                   // row stride of P and dS
  static constexpr int k = 0;                                        // K rotated: (bwd_keys, ld) S
  static constexpr int v = k + T::bwd_keys * T::ld * z;              // V: (bwd_keys, ld) S
  static constexpr int q = v + T::bwd_keys * T::ld * z;              // Q rotated: (bwd_rows, ld) S
  static constexpr int dout = q + T::bwd_rows * T::ld * z;           // dO: (bwd_rows, ld) S
  static constexpr int stage = dout + T::bwd_rows * T::ld * z;       // per warp: a (16, 16) f32 block
  static constexpr int p = stage + T::warps * 16 * 16 * 4;           // P: (bwd_rows, pld) S
  static constexpr int ds = p + T::bwd_rows * pld * z;               // dS: (bwd_rows, pld) S
  static constexpr int lse = ds + T::bwd_rows * pld * z;             // (bwd_rows) f32
  static constexpr int delta = lse + T::bwd_rows * 4;                // (bwd_rows) f32
  static constexpr int inv_freq = (delta + T::bwd_rows * 4 + 31) / 32 * 32;  // RoPE: (max_hd / 2) double
  static constexpr int bytes = inv_freq + max_hd / 2 * 8;
  static_assert(v % 32 == 0 && q % 32 == 0 && dout % 32 == 0 && stage % 32 == 0 && p % 32 == 0 && ds % 32 == 0 &&
                    (16 * pld * z) % 32 == 0 && (16 * T::ld * z) % 32 == 0,
                "attention: wmma needs 32-byte aligned tiles");
  static_assert(T::bwd_keys * T::ldf * 4 <= q - k && T::bwd_rows * T::ldf * 4 <= q - k &&
                    T::bwd_keys * T::ldf * 4 <= stage - q,
                "attention: the f32 staging of dK, dV, dQ fits over the tiles");
  static_assert(bytes <= 48 * 1024, "attention: static shared memory is limited to 48 KiB per block");
};

// ---------------------------------------------------------------------------
// Forward. Block (query tile, head, batch); warp w owns query rows
// [16 w, 16 w + 16) of the tile, lane l row 16 w + l / 2.
template <class S>
__global__ void __launch_bounds__(Tiles<S>::threads)
    attention_forward_kernel(AttentionShape d, float scale, const S* q, i64 ldq, const S* k, i64 ldk, const S* v,
                             i64 ldv, S* o, float* lse) {
  using T = Tiles<S>;
  using L = ForwardSmem<S>;
  constexpr int rows = T::fwd_rows, keys = T::fwd_keys, ld = T::ld, pld = L::pld;
  alignas(128) __shared__ unsigned char smem[L::bytes];
  S* q_s = carve<S>(smem, L::q);
  S* k_s = carve<S>(smem, L::k);
  S* v_s = carve<S>(smem, L::v);
  double* inv_freq_s = carve<double>(smem, L::inv_freq);

  const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
  const int hd = static_cast<int>(d.head_dim), hd_pad = (hd + 15) / 16 * 16;
  const i64 seq = d.seq, heads = d.heads;
  const i64 r0 = (ceil_div(seq, rows) - 1 - blockIdx.x) * rows;
  const i64 h = blockIdx.y, b = blockIdx.z, g = h / (heads / d.kv_heads);
  const double* rope = nullptr;
  if (d.rope) {
    fill_inv_freq<T::threads>(inv_freq_s, hd, d.rope_theta, d.rope_scaling);
    rope = inv_freq_s;
    __syncthreads();
  }
  load_tile<T::threads, rows, ld>(q_s, q + (b * seq + r0) * ldq + h * hd, ldq, static_cast<int>(min64(rows, seq - r0)),
                                  r0, hd, hd_pad, rope);

  const S* q_w = q_s + warp * 16 * ld;                                // this warp's 16 rows of Q
  float* score_w = carve<float>(smem, L::scores) + warp * 16 * keys;  // this warp's (16, keys) scores
  S* p_w = carve<S>(smem, L::p) + warp * 16 * pld;                    // this warp's (16, pld) probabilities
  const int row = lane_row(), col0 = lane_col0();
  const i64 warp_row0 = r0 + warp * 16, qpos = warp_row0 + row;
  const i64 first_key = attention_window_start(qpos, d.window);            // of this lane's row
  const i64 warp_first_key = attention_window_start(warp_row0, d.window);  // of the warp's first row: the earliest
  constexpr int per_lane = keys / 2;  // of a score row: columns first .. first + per_lane - 1
  const int first = lane % 2 * per_lane;

  math::OnlineSoftmax<float> stats;  // of this lane's row
  float acc[max_hd / 16][8] = {};    // this lane's row of O (unnormalized): columns 16 c + col0 + e
  const i64 key_tiles = (min64(seq, r0 + rows) - 1) / keys + 1;  // tiles past the tile's last row are all masked
  // tiles before the window of the block's first row are masked for every row
  for (i64 kt = attention_window_start(r0, d.window) / keys; kt < key_tiles; ++kt) {
    const i64 k0 = kt * keys;
    const int valid = static_cast<int>(min64(keys, seq - k0));
    __syncthreads();  // the previous K, V (and, at the first tile, the Q load) done
    load_tile<T::threads, keys, ld>(k_s, k + (b * seq + k0) * ldk + g * hd, ldk, valid, k0, hd, hd_pad, rope);
    load_tile<T::threads, keys, ld>(v_s, v + (b * seq + k0) * ldv + g * hd, ldv, valid, k0, hd, hd_pad,
                                    static_cast<const double*>(nullptr));
    __syncthreads();
    // the warp's rows are padding, all before these keys, or all with windows starting after them
    if (warp_row0 >= seq || k0 > warp_row0 + 15 || k0 + keys <= warp_first_key) continue;

    for (int cb = 0; cb < keys / 16; ++cb) {  // S = Q K^T
      WarpTile<S> t;
      t.zero();
      t.template mma<true, false>(q_w, ld, k_s + cb * 16 * ld, ld, hd_pad);
      t.store(score_w + cb * 16, keys);
    }
    __syncwarp();
    float p[per_lane];
    float tile_max = neg_inf;
#pragma unroll
    for (int e = 0; e < per_lane; ++e) {
      const i64 key = k0 + first + e;
      p[e] = key <= qpos && key >= first_key && key < seq ? score_w[row * keys + first + e] * scale : neg_inf;
      tile_max = fmaxf(tile_max, p[e]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(full_mask, tile_max, 1));
    const float m_new = fmaxf(stats.m, tile_max);
    // -inf while the row has met no key of its window (it starts past these
    // keys, or the row is padding): its p are 0, and exp(-inf - -inf) is not
    const float shift = m_new == neg_inf ? 0.0f : m_new;
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < per_lane; ++e) {
      p[e] = expf(p[e] - shift);
      sum += p[e];
    }
    sum += __shfl_xor_sync(full_mask, sum, 1);
    const float alpha = stats.merge(math::OnlineSoftmax<float>{m_new, sum});  // rescales the sums against the old max
#pragma unroll
    for (int e = 0; e < per_lane; ++e) p_w[row * pld + first + e] = from_float<S>(p[e]);
    __syncwarp();
    WarpRows<S, keys> p_rows;
    p_rows.load(p_w, pld, keys);

#pragma unroll
    for (int c = 0; c < max_hd / 16; ++c) {  // O = alpha O + P V, a 16-column block at a time through score_w
      if (c * 16 < hd_pad) {
        WarpTile<S> t;
        t.zero();
        t.template mma<true>(p_rows, v_s + c * 16, ld, keys);
        t.store(score_w, 16);
        __syncwarp();
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[c][e] = acc[c][e] * alpha + score_w[row * 16 + col0 + e];
        __syncwarp();
      }
    }
  }

  if (qpos < seq) {
    const float inv = 1.0f / stats.s;
    S* orow = o + (b * seq + qpos) * (heads * hd) + h * hd;
#pragma unroll
    for (int c = 0; c < max_hd / 16; ++c)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int col = c * 16 + col0 + e;
        if (col < hd) orow[col] = from_float<S>(acc[c][e] * inv);
      }
    if (lane % 2 == 0) lse[(b * heads + h) * seq + qpos] = stats.lse();
  }
}

// ---------------------------------------------------------------------------
// delta = rowsum(dO * O) per (batch, head, position), one warp per row.
inline constexpr int delta_warps = 8;

template <class S>
__global__ void __launch_bounds__(delta_warps * warp_size)
    attention_delta_kernel(AttentionShape d, const S* o, const S* dout, float* delta) {
  const i64 item = static_cast<i64>(blockIdx.x) * delta_warps + threadIdx.x / warp_size;  // (b, h, t)
  if (item >= d.batch * d.heads * d.seq) return;  // a whole warp
  const int lane = threadIdx.x % warp_size, hd = static_cast<int>(d.head_dim);
  const i64 t = item % d.seq, bh = item / d.seq, h = bh % d.heads, b = bh / d.heads;
  const i64 at = (b * d.seq + t) * (d.heads * hd) + h * hd;
  float sum = 0.0f;
  for (int c = lane; c < hd; c += warp_size) sum += to_float(dout[at + c]) * to_float(o[at + c]);
  sum = warp_sum(sum);
  if (lane == 0) delta[item] = sum;
}

// One 16x16 block of P and dS, by one warp: query rows [16 rb, 16 rb + 16) of
// the query tile (positions r0 + ...), keys [16 cb, 16 cb + 16) of the key
// tile (positions k0 + ...):
//   p = exp(scale q.k - lse) where query - window < key <= query < seq (window 0:
//   key <= query < seq), else 0;  ds = p (dO.v - delta).
// Writes them to p_out (unless null) and ds_out, both (rows, pld) S.
template <class S>
__device__ void probabilities_block(const S* q_s, const S* dout_s, const S* k_s, const S* v_s, const float* lse_s,
                                    const float* delta_s, float* stage, S* p_out, S* ds_out, int pld, int rb, int cb,
                                    int hd_pad, float scale, i64 r0, i64 k0, i64 seq, i64 window) {
  constexpr int ld = Tiles<S>::ld;
  const int row = lane_row(), col0 = lane_col0();
  const int r = rb * 16 + row, c = cb * 16 + col0;  // this lane's row and first column in the (rows, keys) tile
  const i64 qpos = r0 + r, first_key = attention_window_start(qpos, window);
  float p[8];
  // some pair is unmasked: the block's first row is not padding, its first key is
  // not after its last row, and its last key not before its first row's window
  const i64 q_first = r0 + rb * 16, k_first = k0 + cb * 16;
  const bool any = q_first < seq && k_first <= q_first + 15 && k_first + 15 >= attention_window_start(q_first, window);
  if (!any) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (p_out != nullptr) p_out[r * pld + c + e] = from_float<S>(0.0f);
      ds_out[r * pld + c + e] = from_float<S>(0.0f);
    }
    return;
  }
  WarpTile<S> t;
  t.zero();
  t.template mma<true, false>(q_s + rb * 16 * ld, ld, k_s + cb * 16 * ld, ld, hd_pad);  // S = Q K^T
  t.store(stage, 16);
  __syncwarp();
  const float l = lse_s[r];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const i64 key = k0 + c + e;
    p[e] = key <= qpos && key >= first_key && qpos < seq ? expf(stage[row * 16 + col0 + e] * scale - l) : 0.0f;
  }
  __syncwarp();
  t.zero();
  t.template mma<true, false>(dout_s + rb * 16 * ld, ld, v_s + cb * 16 * ld, ld, hd_pad);  // dP = dO V^T
  t.store(stage, 16);
  __syncwarp();
  const float dl = delta_s[r];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (p_out != nullptr) p_out[r * pld + c + e] = from_float<S>(p[e]);
    ds_out[r * pld + c + e] = from_float<S>(p[e] * (stage[row * 16 + col0 + e] - dl));
  }
  __syncwarp();
}

// lse and delta of query rows [r0, r0 + rows) of head h into shared memory (0 past seq).
template <int Threads, int Rows>
__device__ void load_row_stats(float* lse_s, float* delta_s, const float* lse, const float* delta, i64 at, int valid) {
  for (int r = threadIdx.x; r < Rows; r += Threads) {
    lse_s[r] = r < valid ? lse[at + r] : 0.0f;
    delta_s[r] = r < valid ? delta[at + r] : 0.0f;
  }
}

// dK, dV. Block (key tile, kv head, batch): loops over the group's query heads
// and the query tiles that reach the key tile (from its diagonal to the tile
// of the last query whose window holds its last key). Warp w owns the 16x16 blocks
// w, w + warps, ... of dK and of dV (keys, hd_pad), row-major block order.
template <class S>
__global__ void __launch_bounds__(Tiles<S>::threads)
    attention_backward_dkdv_kernel(AttentionShape d, float scale, const S* q, i64 ldq, const S* k, i64 ldk,
                                   const S* v, i64 ldv, const float* lse, const S* dout, const float* delta, S* dk,
                                   i64 lddk, S* dv, i64 lddv) {
  using T = Tiles<S>;
  using L = BackwardSmem<S>;
  constexpr int rows = T::bwd_rows, keys = T::bwd_keys, ld = T::ld, pld = L::pld, warps = T::warps;
  constexpr int max_blocks = keys / 16 * (max_hd / 16) / warps;  // per warp, per product
  alignas(128) __shared__ unsigned char smem[L::bytes];
  S* k_s = carve<S>(smem, L::k);
  S* v_s = carve<S>(smem, L::v);
  S* q_s = carve<S>(smem, L::q);
  S* dout_s = carve<S>(smem, L::dout);
  S* p_s = carve<S>(smem, L::p);
  S* ds_s = carve<S>(smem, L::ds);
  float* lse_s = carve<float>(smem, L::lse);
  float* delta_s = carve<float>(smem, L::delta);
  double* inv_freq_s = carve<double>(smem, L::inv_freq);

  const int warp = threadIdx.x / warp_size;
  const int hd = static_cast<int>(d.head_dim), hd_pad = (hd + 15) / 16 * 16, col_blocks = hd_pad / 16;
  const i64 seq = d.seq, heads = d.heads, rep = heads / d.kv_heads, ldo = heads * hd;
  const i64 k0 = static_cast<i64>(blockIdx.x) * keys, g = blockIdx.y, b = blockIdx.z;
  const int valid_keys = static_cast<int>(min64(keys, seq - k0));
  float* stage = carve<float>(smem, L::stage) + warp * 256;
  const double* rope = nullptr;
  if (d.rope) {
    fill_inv_freq<T::threads>(inv_freq_s, hd, d.rope_theta, d.rope_scaling);
    rope = inv_freq_s;
    __syncthreads();
  }
  load_tile<T::threads, keys, ld>(k_s, k + (b * seq + k0) * ldk + g * hd, ldk, valid_keys, k0, hd, hd_pad, rope);
  load_tile<T::threads, keys, ld>(v_s, v + (b * seq + k0) * ldv + g * hd, ldv, valid_keys, k0, hd, hd_pad,
                                  static_cast<const double*>(nullptr));

  WarpTile<S> dk_acc[max_blocks], dv_acc[max_blocks];  // gradients of the rotated K (unscaled) and of V
#pragma unroll
  for (int i = 0; i < max_blocks; ++i) {
    dk_acc[i].zero();
    dv_acc[i].zero();
  }
  // query tiles with a row at or after k0 whose windows reach the tile's last key
  const i64 last_query_tile = attention_window_end(k0 + valid_keys - 1, d.window, seq) / rows;
  for (i64 h = g * rep; h < (g + 1) * rep; ++h) {
    for (i64 qt = k0 / rows; qt <= last_query_tile; ++qt) {
      const i64 r0 = qt * rows;
      const int valid = static_cast<int>(min64(rows, seq - r0));
      __syncthreads();  // the previous tile's products done
      load_tile<T::threads, rows, ld>(q_s, q + (b * seq + r0) * ldq + h * hd, ldq, valid, r0, hd, hd_pad, rope);
      load_tile<T::threads, rows, ld>(dout_s, dout + (b * seq + r0) * ldo + h * hd, ldo, valid, r0, hd, hd_pad,
                                      static_cast<const double*>(nullptr));
      load_row_stats<T::threads, rows>(lse_s, delta_s, lse, delta, (b * heads + h) * seq + r0, valid);
      __syncthreads();
      for (int sb = warp; sb < rows / 16 * (keys / 16); sb += warps)
        probabilities_block(q_s, dout_s, k_s, v_s, lse_s, delta_s, stage, p_s, ds_s, pld, sb / (keys / 16),
                            sb % (keys / 16), hd_pad, scale, r0, k0, seq, d.window);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < max_blocks; ++i) {
        const int block = warp + i * warps, kr = block / col_blocks, cc = block % col_blocks;
        if (block < keys / 16 * col_blocks) {
          dv_acc[i].template mma<false, true>(p_s + kr * 16, pld, dout_s + cc * 16, ld, rows);  // dV += P^T dO
          dk_acc[i].template mma<false, true>(ds_s + kr * 16, pld, q_s + cc * 16, ld, rows);  // dK += dS^T Q
        }
      }
    }
  }

  __syncthreads();
  float* dk_f = carve<float>(smem, L::q);  // (keys, ldf) over q and dout
  float* dv_f = carve<float>(smem, L::k);  // (keys, ldf) over k and v
#pragma unroll
  for (int i = 0; i < max_blocks; ++i) {
    const int block = warp + i * warps, kr = block / col_blocks, cc = block % col_blocks;
    if (block < keys / 16 * col_blocks) {
      dk_acc[i].store(dk_f + kr * 16 * T::ldf + cc * 16, T::ldf);
      dv_acc[i].store(dv_f + kr * 16 * T::ldf + cc * 16, T::ldf);
    }
  }
  __syncthreads();
  store_tile<T::threads>(dk + (b * seq + k0) * lddk + g * hd, lddk, dk_f, T::ldf, valid_keys, k0, hd, rope, scale);
  store_tile<T::threads>(dv + (b * seq + k0) * lddv + g * hd, lddv, dv_f, T::ldf, valid_keys, k0, hd,
                         static_cast<const double*>(nullptr), 1.0f);
}

// dQ. Block (query tile, head, batch), heaviest first: loops over the key
// tiles at or before the query tile, from the one holding its first row's
// window start. Warp w owns the 16x16 blocks w,
// w + warps, ... of dQ (rows, hd_pad).
template <class S>
__global__ void __launch_bounds__(Tiles<S>::threads)
    attention_backward_dq_kernel(AttentionShape d, float scale, const S* q, i64 ldq, const S* k, i64 ldk, const S* v,
                                 i64 ldv, const float* lse, const S* dout, const float* delta, S* dq, i64 lddq) {
  using T = Tiles<S>;
  using L = BackwardSmem<S>;
  constexpr int rows = T::bwd_rows, keys = T::bwd_keys, ld = T::ld, pld = L::pld, warps = T::warps;
  constexpr int max_blocks = rows / 16 * (max_hd / 16) / warps;
  alignas(128) __shared__ unsigned char smem[L::bytes];
  S* k_s = carve<S>(smem, L::k);
  S* v_s = carve<S>(smem, L::v);
  S* q_s = carve<S>(smem, L::q);
  S* dout_s = carve<S>(smem, L::dout);
  S* ds_s = carve<S>(smem, L::ds);
  float* lse_s = carve<float>(smem, L::lse);
  float* delta_s = carve<float>(smem, L::delta);
  double* inv_freq_s = carve<double>(smem, L::inv_freq);

  const int warp = threadIdx.x / warp_size;
  const int hd = static_cast<int>(d.head_dim), hd_pad = (hd + 15) / 16 * 16, col_blocks = hd_pad / 16;
  const i64 seq = d.seq, heads = d.heads, ldo = heads * hd;
  const i64 r0 = (ceil_div(seq, rows) - 1 - blockIdx.x) * rows;
  const i64 h = blockIdx.y, b = blockIdx.z, g = h / (heads / d.kv_heads);
  const int valid = static_cast<int>(min64(rows, seq - r0));
  float* stage = carve<float>(smem, L::stage) + warp * 256;
  const double* rope = nullptr;
  if (d.rope) {
    fill_inv_freq<T::threads>(inv_freq_s, hd, d.rope_theta, d.rope_scaling);
    rope = inv_freq_s;
    __syncthreads();
  }
  load_tile<T::threads, rows, ld>(q_s, q + (b * seq + r0) * ldq + h * hd, ldq, valid, r0, hd, hd_pad, rope);
  load_tile<T::threads, rows, ld>(dout_s, dout + (b * seq + r0) * ldo + h * hd, ldo, valid, r0, hd, hd_pad,
                                  static_cast<const double*>(nullptr));
  load_row_stats<T::threads, rows>(lse_s, delta_s, lse, delta, (b * heads + h) * seq + r0, valid);

  WarpTile<S> dq_acc[max_blocks];  // gradient of the rotated Q, unscaled
#pragma unroll
  for (int i = 0; i < max_blocks; ++i) dq_acc[i].zero();
  const i64 key_tiles = (r0 + valid - 1) / keys + 1;  // tiles past the tile's last row are all masked
  // tiles before the window of the tile's first row are masked for every row
  for (i64 kt = attention_window_start(r0, d.window) / keys; kt < key_tiles; ++kt) {
    const i64 k0 = kt * keys;
    const int valid_keys = static_cast<int>(min64(keys, seq - k0));
    __syncthreads();  // the previous tile's products (and, at the first tile, the loads above) done
    load_tile<T::threads, keys, ld>(k_s, k + (b * seq + k0) * ldk + g * hd, ldk, valid_keys, k0, hd, hd_pad, rope);
    load_tile<T::threads, keys, ld>(v_s, v + (b * seq + k0) * ldv + g * hd, ldv, valid_keys, k0, hd, hd_pad,
                                    static_cast<const double*>(nullptr));
    __syncthreads();
    for (int sb = warp; sb < rows / 16 * (keys / 16); sb += warps)
      probabilities_block(q_s, dout_s, k_s, v_s, lse_s, delta_s, stage, static_cast<S*>(nullptr), ds_s, pld,
                          sb / (keys / 16), sb % (keys / 16), hd_pad, scale, r0, k0, seq, d.window);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < max_blocks; ++i) {
      const int block = warp + i * warps, qr = block / col_blocks, cc = block % col_blocks;
      if (block < rows / 16 * col_blocks)
        dq_acc[i].template mma<true, true>(ds_s + qr * 16 * pld, pld, k_s + cc * 16, ld, keys);  // dQ += dS K
    }
  }

  __syncthreads();
  float* dq_f = carve<float>(smem, L::k);  // (rows, ldf) over k and v
#pragma unroll
  for (int i = 0; i < max_blocks; ++i) {
    const int block = warp + i * warps, qr = block / col_blocks, cc = block % col_blocks;
    if (block < rows / 16 * col_blocks) dq_acc[i].store(dq_f + qr * 16 * T::ldf + cc * 16, T::ldf);
  }
  __syncthreads();
  store_tile<T::threads>(dq + (b * seq + r0) * lddq + h * hd, lddq, dq_f, T::ldf, valid, r0, hd, rope, scale);
}

// ---------------------------------------------------------------------------
// Preconditions, checked on the host before any launch.
inline void check_shape(const AttentionShape& d, const char* fn) {
  if (d.batch < 0 || d.seq < 0 || d.heads <= 0 || d.kv_heads <= 0)
    throw std::invalid_argument(std::string(fn) + ": batch, seq must be >= 0 and heads, kv_heads > 0");
  if (d.heads % d.kv_heads != 0) throw std::invalid_argument(std::string(fn) + ": kv_heads must divide heads (GQA)");
  if (d.head_dim <= 0 || d.head_dim > attention_max_head_dim || d.head_dim % 8 != 0)
    throw std::invalid_argument(std::string(fn) + ": head_dim must be a multiple of 8 in [8, 128], got " +
                                std::to_string(d.head_dim));
  if (d.heads > 65535 || d.batch > 65535)
    throw std::invalid_argument(std::string(fn) + ": heads and batch must be at most 65535 (grid y, z)");
  if (d.window < 0) throw std::invalid_argument(std::string(fn) + ": window must be >= 0 (0: no sliding window)");
}
inline void check_stride(std::int64_t ld, std::int64_t width, const char* fn, const char* name) {
  if (ld < width)
    throw std::invalid_argument(std::string(fn) + ": row stride " + name + " is smaller than the row width");
}
inline float softmax_scale(const AttentionShape& d) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
}

}  // namespace attention_detail

// ---------------------------------------------------------------------------
// Forward. Token n = b * seq + t is row n.
//   q: (N, heads * hd), row stride ldq; k, v: (N, kv_heads * hd), strides ldk, ldv (un-rotated)
//   o: (N, heads * hd) dense; lse: (batch, heads, seq) f32, log-sum-exp of each
//   query row's scaled causal (and windowed) scores.
template <class S>
void attention_forward(const AttentionShape& d, const S* q, std::int64_t ldq, const S* k, std::int64_t ldk,
                       const S* v, std::int64_t ldv, S* o, float* lse, cudaStream_t stream) {
  using namespace attention_detail;
  check_shape(d, "attention_forward");
  check_stride(ldq, d.heads * d.head_dim, "attention_forward", "ldq");
  check_stride(ldk, d.kv_heads * d.head_dim, "attention_forward", "ldk");
  check_stride(ldv, d.kv_heads * d.head_dim, "attention_forward", "ldv");
  if (d.batch == 0 || d.seq == 0) return;
  using T = Tiles<S>;
  const dim3 grid(static_cast<unsigned>(ceil_div(d.seq, T::fwd_rows)), static_cast<unsigned>(d.heads),
                  static_cast<unsigned>(d.batch));
  launch(attention_forward_kernel<S>, "attention_forward_kernel", grid, dim3(T::threads), stream, d, softmax_scale(d), q, ldq, k, ldk, v, ldv, o,
         lse);
}

// Backward from the saved (un-rotated) q, k, v, the output o and lse.
//   q, k, v, o, lse as in attention_forward; dout: (N, heads * hd) dense
//   dq: (N, heads * hd), stride lddq; dk, dv: (N, kv_heads * hd), strides lddk, lddv:
//   every element within their row widths is overwritten.
//   scratch: attention_backward_scratch_floats(d) f32 (delta).
template <class S>
void attention_backward(const AttentionShape& d, const S* q, std::int64_t ldq, const S* k, std::int64_t ldk,
                        const S* v, std::int64_t ldv, const S* o, const float* lse, const S* dout, S* dq,
                        std::int64_t lddq, S* dk, std::int64_t lddk, S* dv, std::int64_t lddv, float* scratch,
                        cudaStream_t stream) {
  using namespace attention_detail;
  check_shape(d, "attention_backward");
  check_stride(ldq, d.heads * d.head_dim, "attention_backward", "ldq");
  check_stride(ldk, d.kv_heads * d.head_dim, "attention_backward", "ldk");
  check_stride(ldv, d.kv_heads * d.head_dim, "attention_backward", "ldv");
  check_stride(lddq, d.heads * d.head_dim, "attention_backward", "lddq");
  check_stride(lddk, d.kv_heads * d.head_dim, "attention_backward", "lddk");
  check_stride(lddv, d.kv_heads * d.head_dim, "attention_backward", "lddv");
  if (d.batch == 0 || d.seq == 0) return;
  using T = Tiles<S>;
  const float scale = softmax_scale(d);
  float* delta = scratch;  // (batch, heads, seq)
  launch(attention_delta_kernel<S>, "attention_delta_kernel",
         dim3(static_cast<unsigned>(ceil_div(attention_backward_scratch_floats(d), delta_warps))),
         dim3(delta_warps * warp_size), stream, d, o, dout, delta);
  const dim3 kv_grid(static_cast<unsigned>(ceil_div(d.seq, T::bwd_keys)), static_cast<unsigned>(d.kv_heads),
                     static_cast<unsigned>(d.batch));
  launch(attention_backward_dkdv_kernel<S>, "attention_backward_dkdv_kernel", kv_grid, dim3(T::threads), stream, d, scale, q, ldq, k, ldk, v, ldv, lse,
         dout, static_cast<const float*>(delta), dk, lddk, dv, lddv);
  const dim3 q_grid(static_cast<unsigned>(ceil_div(d.seq, T::bwd_rows)), static_cast<unsigned>(d.heads),
                    static_cast<unsigned>(d.batch));
  launch(attention_backward_dq_kernel<S>, "attention_backward_dq_kernel", q_grid, dim3(T::threads), stream, d, scale, q, ldq, k, ldk, v, ldv, lse,
         dout, static_cast<const float*>(delta), dq, lddq);
}

}  // namespace headroom::cuda
