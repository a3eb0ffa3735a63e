#pragma once
// Causal self-attention on the host (CPU), flash style (Dao et al. 2022,
// arXiv:2205.14135; FlashAttention-2, Dao 2023, arXiv:2307.08691):
//
//   forward   O = softmax(Q K^T / sqrt(hd) + causal mask) V, one query tile at a
//             time against the key tiles at or before it, with a running row max
//             and sum (online softmax, math/softmax.hpp); saves lse per row.
//   backward  from the saved q, k, v, o, lse: P = exp(S - lse) recomputed tile by
//             tile; dV = P^T dO, dP = dO V^T, dS = P (dP - delta), dK = dS^T Q,
//             dQ = dS K, with delta = rowsum(dO * O). No (seq, seq) array exists.
//   decode    one new token per sequence against a KV cache (incremental decoding).
//
// Sliding window (Mistral; d.window = W > 0): query position p attends to key
// positions p - W + 1 .. p only (transformers' sliding_window mask). The
// forward starts each query tile's loop at the first key tile its first row
// reaches; the backward stops each key tile's loop at the last query tile that
// reaches its last key; decode reads the cache from p - W + 1. Tiles that
// straddle the window's edge are masked element by element, so the work is
// about seq * W rather than seq^2 / 2.
//
// RoPE (math/rope.hpp's convention: element i pairs with i + hd/2, inv_freq_i =
// theta^(-2i/hd)) rotates q and k as their tiles are loaded; backward returns
// gradients of the un-rotated q and k (the inverse rotation of dq_rot, dk_rot).
// GQA: query head h reads kv head h / (heads / kv_heads).
//
// Storage: T is float, double or bf16 (host/storage.hpp); the tiles, the
// scratch, lse and every sum are in C = compute_t<T>. A bf16 run loads its q,
// k, v and dO tiles widened, accumulates dq in f32 for the work item, and
// rounds each output element once.
//
// Memory: the kernels use only the caller's scratch (sizes below, in elements
// of C), the inputs and the outputs: no heap. The tile products
// (tile_product) run host::gemm's kernel for the CPU (float) with 64 KiB of
// packing panels on the worker's stack, or Eigen products of row-major maps,
// which on 64-row tiles pack their panels on the stack too
// (EIGEN_STACK_ALLOCATION_LIMIT).
//
// Parallelism: one OpenMP team of `workers` threads; worker w uses its own
// scratch tiles. Every output element is written by one work item, computed
// the same way whichever worker runs it, so results are bit-identical for any
// worker count and any scratch address (not across compilers: GCC and Clang
// fuse multiply-adds differently). The softmax exponentials and row sums are
// our own 8-lane code (detail::exp8, detail::max_of), not Eigen's, because
// Eigen's element-wise exp takes a scalar path for the elements before the
// first aligned address: its bits would depend on where the scratch lies.
// Eigen's products stay on their worker's thread (see attention_team), unless
// the program raised Eigen::setNbThreads above 1. Without OpenMP everything
// runs on the calling thread, whatever `workers` says.
#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "../math/attention_window.hpp"
#include "../math/rope.hpp"
#include "for_this_cpu.hpp"
#include "gemm.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace headroom::host {

struct AttentionDims {
  std::int64_t batch, seq, heads, kv_heads, head_dim;  // heads % kv_heads == 0 (GQA: query head h uses kv head h / (heads / kv_heads))
  bool rope = false;                                    // Llama RoPE (math/rope.hpp convention, rotate_half), applied to q and k on the fly
  double rope_theta = 10000.0;
  math::RopeScaling rope_scaling{};                     // Llama 3.1's, when on()
  std::int64_t window = 0;                              // sliding window: position p attends to p - window + 1 .. p; 0: none
};

inline constexpr std::int64_t attention_tile = 64;  // t: rows of a query / key tile

using math::attention_window_end;    // the last query reaching a key
using math::attention_window_start;  // the first key a query reaches

// Scratch, in elements of C.
//   forward:  [rope table (seq, hd)] [per worker: S (t, t) | Q (t, hd) | K, then V (t, hd) | O (t, hd) | m (t) | l (t)]
//   backward: [delta (batch, heads, seq)] [rope table (seq, hd)]
//             [per worker: P/dS (t, t) | dP (t, t) | Q, K, V, dK, dV (t, hd) each | 2 t unused
//              | bf16 (widened): dO (t, hd) | dq (heads / kv_heads, seq, hd)]
//   decode:   [per worker: scores (max_seq) | q (hd) | out accumulator (hd)]
// The rope table holds, for each position, hd/2 cosines then hd/2 sines; it is
// reserved (and left alone) when d.rope is false.
constexpr std::int64_t attention_forward_scratch(const AttentionDims& d, int workers) {
  const std::int64_t t = attention_tile;
  return d.seq * d.head_dim + workers * (t * t + 3 * t * d.head_dim + 2 * t);
}
constexpr std::int64_t attention_backward_scratch(const AttentionDims& d, int workers, bool widened = false) {
  const std::int64_t t = attention_tile;
  const std::int64_t extra = widened ? t * d.head_dim + d.heads / d.kv_heads * d.seq * d.head_dim : 0;
  return d.batch * d.heads * d.seq + d.seq * d.head_dim + workers * (2 * t * t + 5 * t * d.head_dim + 2 * t + extra);
}
constexpr std::int64_t attention_decode_scratch(const AttentionDims& d, std::int64_t max_seq, int workers) {
  return workers * (max_seq + 2 * d.head_dim);
}

namespace detail {

using i64 = std::int64_t;

// ---------------------------------------------------------------------------
// Preconditions: one sentence naming the kernel and the rule.
inline void check_attention_dims(const AttentionDims& d, const char* kernel) {
  if (d.batch < 0 || d.seq < 0 || d.heads <= 0 || d.kv_heads <= 0 || d.head_dim <= 0)
    throw std::invalid_argument(std::string(kernel) + ": batch, seq must be >= 0 and heads, kv_heads, head_dim > 0");
  if (d.heads % d.kv_heads != 0)
    throw std::invalid_argument(std::string(kernel) + ": kv_heads must divide heads (GQA)");
  if (d.rope && d.head_dim % 2 != 0)
    throw std::invalid_argument(std::string(kernel) + ": RoPE needs an even head_dim (element i pairs with i + head_dim/2)");
  if (d.window < 0) throw std::invalid_argument(std::string(kernel) + ": window must be >= 0 (0: no sliding window)");
}
inline void check_workers(int workers, const char* kernel) {
  if (workers < 1) throw std::invalid_argument(std::string(kernel) + ": workers must be >= 1");
}
inline void check_stride(i64 ld, i64 width, const char* kernel, const char* name) {
  if (ld < width)
    throw std::invalid_argument(std::string(kernel) + ": row stride " + name + " is smaller than the row width");
}

// ---------------------------------------------------------------------------
// The keys query position p attends to in a score tile whose first key is k0,
// nk keys wide: columns [lo, hi), at or before p and inside p's window;
// {0, 0} where there are none (p's window starts past the tile).
struct KeyRange {
  i64 lo, hi;
};
inline KeyRange row_keys(i64 p, i64 k0, i64 nk, i64 window) {
  const i64 lo = std::max<i64>(0, attention_window_start(p, window) - k0), hi = std::min(nk, p - k0 + 1);
  return lo < hi ? KeyRange{lo, hi} : KeyRange{0, 0};
}

// ---------------------------------------------------------------------------
// Eight lanes at a time, written with the GCC / Clang vector extension rather
// than left to the auto-vectoriser: GCC will not vectorise the exp below (it
// splits the clamps into branches and then refuses to speculate floating
// point), and an explicit lane layout fixes the order of every sum. A partial
// chunk goes through the same lanes (padded), so every element is computed by
// the same code whatever its position or alignment. Vector values stay inside
// the functions (arguments are T*), so no vector crosses a call: no -Wpsabi,
// and no ABI that depends on the -m flags of the translation unit.
inline constexpr int lanes = 8;

template <class T>
struct Lanes;
template <>
struct Lanes<float> {
  typedef float F __attribute__((vector_size(lanes * sizeof(float))));                // (8) float
  typedef std::int32_t I __attribute__((vector_size(lanes * sizeof(std::int32_t))));  // (8) int32
};
template <>
struct Lanes<double> {
  typedef double F __attribute__((vector_size(lanes * sizeof(double))));              // (8) double
  typedef std::int64_t I __attribute__((vector_size(lanes * sizeof(std::int64_t))));  // (8) int64
};

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]
// (Cody-Waite reduction with ln 2 split in two so n * ln2_hi is exact), exp(r)
// by its Taylor polynomial to the degree that makes the truncation error
// smaller than half an ulp (0.347^8/8! = 5e-9 for float, 0.347^14/14! = 4e-18
// for double). n comes from adding 1.5 * 2^mantissa, which leaves
// round(x log2 e) in the low bits of the sum (no float-to-int conversion, so
// no undefined behaviour for NaN); 2^n is built from its bits, and is 0 when n
// is below the smallest normal exponent: results under about 2^-126 (float) /
// 2^-1022 (double) are 0, exp(-inf) = 0. Arguments above `hi` are clamped
// (attention only passes x <= 0, up to rounding); NaN stays NaN.
template <class T>
struct ExpConstants;
template <>
struct ExpConstants<float> {
  static constexpr int mantissa = 23, bias = 127, degree = 7;
  static constexpr float lo = -100.0f, hi = 88.3f;        // n in [-145, 127]
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f;           // 9 significant bits
  static constexpr float ln2_lo = -2.12194440054690e-4f;  // ln 2 - ln2_hi
  static constexpr float round_magic = 12582912.0f;       // 1.5 * 2^23
};
template <>
struct ExpConstants<double> {
  static constexpr int mantissa = 52, bias = 1023, degree = 13;
  static constexpr double lo = -800.0, hi = 709.0;               // n in [-1155, 1023]
  static constexpr double log2e = 1.44269504088896340736;
  static constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits
  static constexpr double ln2_lo = 1.90821492927058770002e-10;  // ln 2 - ln2_hi
  static constexpr double round_magic = 6755399441055744.0;     // 1.5 * 2^52
};

constexpr double inv_factorial(int k) {
  double f = 1.0;
  for (int i = 2; i <= k; ++i) f *= i;
  return 1.0 / f;
}

// x[l] <- exp(x[l] - shift) and sums[l] += the result, for l in [0, 8); x, sums: (8)
template <class T>
inline void exp8(T* x, T shift, T* sums) {
  using C = ExpConstants<T>;
  using F = typename Lanes<T>::F;
  using I = typename Lanes<T>::I;
  F v;
  std::memcpy(&v, x, sizeof(F));
  v -= shift;
  const F lo = F{} + C::lo, hi = F{} + C::hi, magic = F{} + C::round_magic;
  F xc = v < lo ? lo : v;  // NaN passes through both
  xc = xc > hi ? hi : xc;
  const F t = xc * C::log2e + C::round_magic;  // round(x log2 e) in the low bits
  const I n = (I)t - (I)magic;                 // same-size vector casts reinterpret the bits
  const F fn = __builtin_convertvector(n, F);
  const F r = (xc - fn * C::ln2_hi) - fn * C::ln2_lo;
  F p = F{} + T(inv_factorial(C::degree));  // Horner from the highest degree
  [&]<int... K>(std::integer_sequence<int, K...>) {
    ((p = p * r + T(inv_factorial(C::degree - 1 - K))), ...);
  }(std::make_integer_sequence<int, C::degree>{});
  I biased = n + C::bias;
  const I zero = I{};
  biased = biased > zero ? biased : zero;  // 2^n under the normal range: 0
  v = p * (F)(biased << C::mantissa);
  std::memcpy(x, &v, sizeof(F));
  F acc;
  std::memcpy(&acc, sums, sizeof(F));
  acc += v;
  std::memcpy(sums, &acc, sizeof(F));
}

// x <- exp(x - shift), elementwise, in one pass with the sum of the results
// (8 lane sums over the chunks in order, then a fixed tree). x: (n)
template <class T>
inline T exp_shifted_sum(T* x, i64 n, T shift) {
  T sums[lanes] = {};
  i64 c = 0;
  for (; c + lanes <= n; c += lanes) exp8(x + c, shift, sums);
  if (c < n) {  // the tail through the same lanes; padding exp(-inf) = 0 adds nothing
    T buf[lanes];
    for (i64 l = 0; l < lanes; ++l) buf[l] = c + l < n ? x[c + l] : -std::numeric_limits<T>::infinity();
    exp8(buf, shift, sums);
    for (i64 l = 0; l < n - c; ++l) x[c + l] = buf[l];
  }
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) sums[l] += sums[l + w];
  return sums[0];
}

// exp(x), one value, through the same lanes (so the same bits as in a row)
template <class T>
inline T exp_approx(T x) {
  T buf[lanes] = {x}, sums[lanes] = {};
  exp8(buf, T(0), sums);
  return buf[0];
}

// Row maximum: lane-wise over chunks of 8 (the tail padded with -inf), then a
// tree over the lanes. x: (n), n >= 1
template <class T>
inline T max_of(const T* x, i64 n) {
  using F = typename Lanes<T>::F;
  const T ninf = -std::numeric_limits<T>::infinity();
  F acc = F{} + ninf, v;
  i64 c = 0;
  for (; c + lanes <= n; c += lanes) {
    std::memcpy(&v, x + c, sizeof(F));
    acc = v > acc ? v : acc;
  }
  if (c < n) {
    T buf[lanes];
    for (i64 l = 0; l < lanes; ++l) buf[l] = c + l < n ? x[c + l] : ninf;
    std::memcpy(&v, buf, sizeof(F));
    acc = v > acc ? v : acc;
  }
  T m[lanes];
  std::memcpy(m, &acc, sizeof(F));
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) m[l] = m[l + w] > m[l] ? m[l + w] : m[l];
  return m[0];
}

// Dot product in a fixed order: 8 lane sums, then a tree. a, b: (n)
template <class T>
inline T dot(const T* a, const T* b, i64 n) {
  using F = typename Lanes<T>::F;
  F acc = F{};
  i64 c = 0;
  for (; c + lanes <= n; c += lanes) {
    F u, v;
    std::memcpy(&u, a + c, sizeof(F));
    std::memcpy(&v, b + c, sizeof(F));
    acc += u * v;
  }
  if (c < n) {
    T ua[lanes] = {}, vb[lanes] = {};
    for (i64 l = 0; l < n - c; ++l) ua[l] = a[c + l], vb[l] = b[c + l];
    F u, v;
    std::memcpy(&u, ua, sizeof(F));
    std::memcpy(&v, vb, sizeof(F));
    acc += u * v;
  }
  T s[lanes];
  std::memcpy(s, &acc, sizeof(F));
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) s[l] += s[l + w];
  return s[0];
}

// ---------------------------------------------------------------------------
// RoPE angles (math/rope.hpp): a = p * inv_freq_i, inv_freq_i = theta^(-2i/hd)
// (scaled as Llama 3.1 does where the scaling is on), in double, so the table
// and decode's on-the-fly rotation agree bit for bit.
inline double rope_inv_freq(i64 i, i64 hd, double theta, const math::RopeScaling& scaling) {
  return math::rope_inv_freq(static_cast<int>(i), static_cast<int>(hd), theta, scaling);
}

// table: (seq, hd), row p = [cos a_0 .. cos a_{hd/2-1} | sin a_0 .. sin a_{hd/2-1}].
// Called by every worker of a team: pair i is worker-shared work (omp for).
template <class T>
void fill_rope_table(T* table, i64 seq, i64 hd, double theta, const math::RopeScaling& scaling) {
  const i64 half = hd / 2;
  auto pair = [&](i64 i) {
    const double inv_freq = rope_inv_freq(i, hd, theta, scaling);
    for (i64 p = 0; p < seq; ++p) {
      const double a = static_cast<double>(p) * inv_freq;
      table[p * hd + i] = static_cast<T>(std::cos(a));
      table[p * hd + half + i] = static_cast<T>(std::sin(a));
    }
  };
#ifdef _OPENMP
  if (omp_in_parallel()) {
#pragma omp for schedule(static)
    for (i64 i = 0; i < half; ++i) pair(i);
    return;
  }
#endif
  for (i64 i = 0; i < half; ++i) pair(i);  // one worker, no team (see attention_team)
}

// dst (rows, hd) dense <- mul * R(p0 + r) src_r for each row r; src rows have
// stride ld. R is the RoPE rotation at the row's position (identity when table
// is null). table: (seq, hd) as fill_rope_table writes it.
template <class T, class S>
inline void load_rows(T* dst, const S* src, i64 ld, i64 rows, i64 hd, const T* table, i64 p0, T mul) {
  const i64 half = hd / 2;
  for (i64 r = 0; r < rows; ++r) {
    const S* x = src + r * ld;
    T* y = dst + r * hd;
    if (table == nullptr) {
      for (i64 c = 0; c < hd; ++c) y[c] = widen(x[c]) * mul;
      continue;
    }
    const T* cs = table + (p0 + r) * hd;  // cos (half) | sin (half)
    for (i64 i = 0; i < half; ++i) {
      const T x0 = widen(x[i]), x1 = widen(x[i + half]);
      y[i] = (x0 * cs[i] - x1 * cs[half + i]) * mul;
      y[i + half] = (x1 * cs[i] + x0 * cs[half + i]) * mul;
    }
  }
}

// dst_r (stride ldd) <- mul * R(p0 + r)^T src_r (stride lds): the inverse
// rotation maps a gradient of rotated vectors to one of un-rotated vectors.
// dst may equal src (each pair is read before it is written).
template <class S, class T>
inline void store_rows_inverse(S* dst, i64 ldd, const T* src, i64 lds, i64 rows, i64 hd, const T* table, i64 p0,
                               T mul) {
  const i64 half = hd / 2;
  for (i64 r = 0; r < rows; ++r) {
    const T* x = src + r * lds;
    S* y = dst + r * ldd;
    if (table == nullptr) {
      for (i64 c = 0; c < hd; ++c) y[c] = narrow<S>(x[c] * mul);
      continue;
    }
    const T* cs = table + (p0 + r) * hd;
    for (i64 i = 0; i < half; ++i) {
      const T x0 = x[i], x1 = x[i + half];
      y[i] = narrow<S>((x0 * cs[i] + x1 * cs[half + i]) * mul);
      y[i + half] = narrow<S>((x1 * cs[i] - x0 * cs[half + i]) * mul);
    }
  }
}

// y (hd) <- mul * R(p) x (hd), angles computed here (decode has no table);
// the same values fill_rope_table stores, so the same bits as load_rows.
template <class T>
inline void rotate_one(T* y, const T* x, i64 hd, i64 p, double theta, const math::RopeScaling& scaling, T mul) {
  const i64 half = hd / 2;
  for (i64 i = 0; i < half; ++i) {
    const double a = static_cast<double>(p) * rope_inv_freq(i, hd, theta, scaling);
    const T c = static_cast<T>(std::cos(a)), s = static_cast<T>(std::sin(a));
    const T x0 = x[i], x1 = x[i + half];
    y[i] = (x0 * c - x1 * s) * mul;
    y[i + half] = (x1 * c + x0 * s) * mul;
  }
}

// ---------------------------------------------------------------------------
// Row-major maps of tiles for Eigen's products.
template <class T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Tile = Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstTile = Eigen::Map<const RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T>
inline Tile<T> tile(T* p, i64 rows, i64 cols, i64 ld) {
  return Tile<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}
template <class T>
inline ConstTile<T> ctile(const T* p, i64 rows, i64 cols, i64 ld) {
  return ConstTile<T>(p, rows, cols, Eigen::OuterStride<>(ld));
}

// C (m, n) = op(A) op(B) (accumulate: C +=), a tile product. float runs
// host::gemm's kernel for host::isa() (AVX2 / AVX-512, chosen at run time:
// the products are most of attention's work) with its panels on this
// thread's stack (at most tile_panel_elements floats, 64 KiB: a 64-row tile
// with head_dim up to 128); double, the portable choice and larger products
// run Eigen's product on row-major maps. Either way the bits depend only on
// the operands, not on where the scratch lies, so the backward's recomputed
// scores equal the forward's.
// (not inlined: a work item's body is compiled once per ISA, for_items, and
// the products dispatch themselves)
inline constexpr i64 tile_panel_elements = 16384;
template <class T>
[[gnu::noinline]] void tile_product(bool ta, bool tb, i64 m, i64 n, i64 k, const T* A, i64 lda, const T* B, i64 ldb,
                         bool accumulate, T* C, i64 ldc) {
  if constexpr (std::is_same_v<T, float>) {
    const i64 panel = GemmBlocking::panel_elements(m, n, k);
    if (isa() != Isa::portable && panel <= tile_panel_elements) {
      alignas(64) float panels[tile_panel_elements];
      gemm_serial(ta ? Trans::yes : Trans::no, tb ? Trans::yes : Trans::no, m, n, k, 1.0f, A, lda, B, ldb,
                  accumulate ? 1.0f : 0.0f, C, ldc, GemmPanels<float>{panels, panel}, 0);
      return;
    }
  }
  const auto a = ctile(A, ta ? k : m, ta ? m : k, lda);
  const auto b = ctile(B, tb ? n : k, tb ? k : n, ldb);
  auto c = tile(C, m, n, ldc);
  if (!accumulate) {
    if (!ta && !tb) c.noalias() = a * b;
    else if (!ta) c.noalias() = a * b.transpose();
    else if (!tb) c.noalias() = a.transpose() * b;
    else c.noalias() = a.transpose() * b.transpose();
  } else {
    if (!ta && !tb) c.noalias() += a * b;
    else if (!ta) c.noalias() += a * b.transpose();
    else if (!tb) c.noalias() += a.transpose() * b;
    else c.noalias() += a.transpose() * b.transpose();
  }
}

// ---------------------------------------------------------------------------
// The team: body(worker) on `workers` threads. Inside, nested parallelism is
// switched off for this team's tasks only (omp_set_num_threads sets the
// calling task's ICV), so Eigen's products stay on their thread even with one
// worker, where Eigen would otherwise start its own team.
// One worker runs on the calling thread, without a parallel region (libgomp
// allocates for a region of one thread each time it opens one).
template <class F>
void attention_team(int workers, F&& body) {
#ifdef _OPENMP
  if (workers == 1) {
    const int outer = omp_get_max_threads();
    omp_set_num_threads(1);
    body(0);
    omp_set_num_threads(outer);
    return;
  }
#pragma omp parallel num_threads(workers)
  {
    omp_set_num_threads(1);
    body(omp_get_thread_num());
  }
#else
  (void)workers;
  body(0);
#endif
}

// f(item) for item in [0, n), shared by the team (called by every worker);
// the order items are handed out in does not change any result.
// Each item runs through for_this_cpu: the row loops around the products
// (RoPE, the online softmax, bf16 widening) compiled for the CPU's ISA.
template <class F>
void for_items(i64 n, F&& f) {
  const auto run = [&](i64 item) { for_this_cpu(f, item); };
#ifdef _OPENMP
  if (omp_in_parallel()) {
#pragma omp for schedule(dynamic, 1)
    for (i64 item = 0; item < n; ++item) run(item);
    return;
  }
#endif
  for (i64 item = 0; item < n; ++item) run(item);  // one worker, no team: a work-sharing loop there would allocate
}

template <class T>
constexpr void check_scalar() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || half_storage<T>,
                "host attention kernels: T must be float, double, bf16 or f16");
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Forward. Token n = b * seq + s is row n.
//   q: (N, heads * hd), row stride ldq; k, v: (N, kv_heads * hd), strides ldk, ldv
//   o: (N, heads * hd) dense; lse: (batch, heads, seq), log-sum-exp of the
//   scaled causal (and windowed) scores of each query row; scratch: attention_forward_scratch(d, workers)
// Work items (batch, head, query tile), heaviest (most key tiles) first; a
// query tile visits the key tiles from the one holding its first row's window
// start up to its diagonal.
template <class X, class T = compute_t<X>>
void attention_forward(const AttentionDims& d, const X* q, std::int64_t ldq, const X* k, std::int64_t ldk, const X* v,
                       std::int64_t ldv, X* o, T* lse, T* scratch, int workers) {
  using namespace detail;
  check_scalar<X>();
  check_attention_dims(d, "attention_forward");
  check_workers(workers, "attention_forward");
  check_stride(ldq, d.heads * d.head_dim, "attention_forward", "ldq");
  check_stride(ldk, d.kv_heads * d.head_dim, "attention_forward", "ldk");
  check_stride(ldv, d.kv_heads * d.head_dim, "attention_forward", "ldv");
  const i64 S = d.seq, H = d.heads, hd = d.head_dim, t = attention_tile;
  const i64 rep = H / d.kv_heads, nt = (S + t - 1) / t, ldo = H * hd;
  const i64 n_items = d.batch * H * nt;
  if (n_items == 0) return;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  T* table = d.rope ? scratch : nullptr;  // (S, hd)
  T* workers_base = scratch + S * hd;
  const i64 per_worker = t * t + 3 * t * hd + 2 * t;

  attention_team(workers, [&](int w) {
    if (table != nullptr) fill_rope_table(table, S, hd, d.rope_theta, d.rope_scaling);  // ends with the team's barrier
    T* sb = workers_base + w * per_worker;  // S, then P: (t, t)
    T* qb = sb + t * t;                     // Q rotated, times scale: (t, hd)
    T* kb = qb + t * hd;                    // K rotated: (t, hd)
    T* ob = kb + t * hd;                    // O accumulator: (t, hd)
    T* mb = ob + t * hd;                    // running row max: (t)
    T* lb = mb + t;                         // running row sum of exp(s - m): (t)

    for_items(n_items, [&](i64 item) {
      const i64 i = nt - 1 - item % nt, bh = item / nt, b = bh / H, h = bh % H, g = h / rep;
      const i64 r0 = i * t, nq = std::min(t, S - r0);
      load_rows(qb, q + (b * S + r0) * ldq + h * hd, ldq, nq, hd, table, r0, scale);
      auto O = tile(ob, nq, hd, hd);
      O.setZero();
      for (i64 r = 0; r < nq; ++r) {
        mb[r] = -std::numeric_limits<T>::infinity();
        lb[r] = T(0);
      }
      for (i64 j = attention_window_start(r0, d.window) / t; j <= i; ++j) {  // earlier tiles: outside every row's window
        const i64 k0 = j * t, nk = std::min(t, S - k0);
        load_rows(kb, k + (b * S + k0) * ldk + g * hd, ldk, nk, hd, table, k0, T(1));
        tile_product(false, true, nq, nk, hd, qb, hd, kb, hd, false, sb, t);  // scores: (nq, nk)
        for (i64 r = 0; r < nq; ++r) {
          T* srow = sb + r * t;
          const auto [lo, hi] = row_keys(r0 + r, k0, nk, d.window);  // diagonal tile: hi = r + 1
          for (i64 c = 0; c < lo; ++c) srow[c] = T(0);
          for (i64 c = hi; c < nk; ++c) srow[c] = T(0);
          if (lo == hi) continue;  // the row's window starts past this tile: nothing to add
          const T m_new = std::max(mb[r], max_of(srow + lo, hi - lo));
          const T alpha = exp_approx(mb[r] - m_new);  // rescales what was summed against the old max
          const T sum = exp_shifted_sum(srow + lo, hi - lo, m_new);
          lb[r] = lb[r] * alpha + sum;
          mb[r] = m_new;
          if (alpha != T(1)) O.row(r) *= alpha;
        }
        if constexpr (std::is_same_v<X, T>) {
          tile_product(false, false, nq, hd, nk, sb, t, v + (b * S + k0) * ldv + g * hd, ldv, true, ob, hd);
        } else {  // V widened into K's tile, which the scores no longer need
          load_rows(kb, v + (b * S + k0) * ldv + g * hd, ldv, nk, hd, static_cast<const T*>(nullptr), k0, T(1));
          tile_product(false, false, nq, hd, nk, sb, t, kb, hd, true, ob, hd);
        }
      }
      for (i64 r = 0; r < nq; ++r) {
        const T inv = T(1) / lb[r];
        X* orow = o + (b * S + r0 + r) * ldo + h * hd;
        for (i64 c = 0; c < hd; ++c) orow[c] = narrow<X>(ob[r * hd + c] * inv);
        lse[(b * H + h) * S + r0 + r] = mb[r] + std::log(lb[r]);
      }
    });
  });
}

// ---------------------------------------------------------------------------
// Backward from the saved (un-rotated) q, k, v, the output o and lse.
//   q, k, v, o, lse as in attention_forward; dout: (N, heads * hd) dense
//   dq: (N, heads * hd), stride lddq; dk, dv: (N, kv_heads * hd), strides lddk, lddv.
//   Every element of dq, dk, dv (within their row widths) is overwritten.
//   scratch: attention_backward_scratch(d, workers)
// Work items (batch, kv head): each owns the dk, dv rows of its kv head and
// the dq rows of its query heads (accumulated in place, key tile by key tile,
// then rotated back), so every output has a single writer. A key tile visits
// the query tiles from its diagonal up to the last one whose window reaches
// its last key.
template <class X, class T = compute_t<X>>
void attention_backward(const AttentionDims& d, const X* q, std::int64_t ldq, const X* k, std::int64_t ldk, const X* v,
                        std::int64_t ldv, const X* o, const T* lse, const X* dout, X* dq, std::int64_t lddq, X* dk,
                        std::int64_t lddk, X* dv, std::int64_t lddv, T* scratch, int workers) {
  using namespace detail;
  check_scalar<X>();
  constexpr bool widened = !std::is_same_v<X, T>;  // dO tiles and the item's dq in T
  check_attention_dims(d, "attention_backward");
  check_workers(workers, "attention_backward");
  check_stride(ldq, d.heads * d.head_dim, "attention_backward", "ldq");
  check_stride(ldk, d.kv_heads * d.head_dim, "attention_backward", "ldk");
  check_stride(ldv, d.kv_heads * d.head_dim, "attention_backward", "ldv");
  check_stride(lddq, d.heads * d.head_dim, "attention_backward", "lddq");
  check_stride(lddk, d.kv_heads * d.head_dim, "attention_backward", "lddk");
  check_stride(lddv, d.kv_heads * d.head_dim, "attention_backward", "lddv");
  const i64 S = d.seq, H = d.heads, KV = d.kv_heads, hd = d.head_dim, t = attention_tile;
  const i64 rep = H / KV, nt = (S + t - 1) / t, ldo = H * hd;
  const i64 n_items = d.batch * KV;
  if (n_items == 0 || S == 0) return;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  T* delta = scratch;                               // rowsum(dO * O): (batch, heads, seq)
  T* table = d.rope ? scratch + d.batch * H * S : nullptr;  // (S, hd)
  T* workers_base = scratch + d.batch * H * S + S * hd;
  const i64 per_worker = 2 * t * t + 5 * t * hd + 2 * t + (widened ? t * hd + rep * S * hd : 0);

  attention_team(workers, [&](int w) {
    if (table != nullptr) fill_rope_table(table, S, hd, d.rope_theta, d.rope_scaling);  // ends with the team's barrier
    T* sb = workers_base + w * per_worker;  // P, then dS: (t, t)
    T* pb = sb + t * t;                     // dP: (t, t)
    T* qb = pb + t * t;                     // Q rotated, times scale: (t, hd)
    T* kb = qb + t * hd;                    // K rotated: (t, hd)
    T* vb = kb + t * hd;                    // V: (t, hd)
    T* dkb = vb + t * hd;                   // dK (rotated): (t, hd)
    T* dvb = dkb + t * hd;                  // dV: (t, hd)
    T* dob = dvb + t * hd + 2 * t;          // widened: dO (t, hd)
    T* dqa = dob + t * hd;                  // widened: dq of the item's heads (rep, S, hd)
    // where head h's dq rows accumulate: dq itself, or (widened) dqa
    const auto dq_rows = [&](i64 b, i64 h, i64 h0) -> T* {
      if constexpr (widened) return dqa + (h - h0) * S * hd;
      else return dq + b * S * lddq + h * hd;
    };
    const i64 lddqa = widened ? hd : lddq;

    for_items(n_items, [&](i64 item) {
      const i64 b = item / KV, g = item % KV, h0 = g * rep;
      // delta for this group's heads; dq rows zeroed (they accumulate below)
      for (i64 h = h0; h < h0 + rep; ++h)
        for (i64 s = 0; s < S; ++s) {
          const i64 n = b * S + s;
          if constexpr (widened) {
            T sum = T(0);
            for (i64 c = 0; c < hd; ++c) sum += widen(dout[n * ldo + h * hd + c]) * widen(o[n * ldo + h * hd + c]);
            delta[(b * H + h) * S + s] = sum;
          } else {
            delta[(b * H + h) * S + s] = dot(dout + n * ldo + h * hd, o + n * ldo + h * hd, hd);
          }
          T* dqrow = dq_rows(b, h, h0) + s * lddqa;
          for (i64 c = 0; c < hd; ++c) dqrow[c] = T(0);
        }
      for (i64 j = 0; j < nt; ++j) {
        const i64 k0 = j * t, nk = std::min(t, S - k0);
        const i64 last_query_tile = attention_window_end(k0 + nk - 1, d.window, S) / t;  // later tiles: past every key's window
        load_rows(kb, k + (b * S + k0) * ldk + g * hd, ldk, nk, hd, table, k0, T(1));
        load_rows(vb, v + (b * S + k0) * ldv + g * hd, ldv, nk, hd, static_cast<const T*>(nullptr), k0, T(1));
        auto dK = tile(dkb, nk, hd, hd);
        auto dV = tile(dvb, nk, hd, hd);
        dK.setZero();
        dV.setZero();
        for (i64 h = h0; h < h0 + rep; ++h) {
          const T* lse_h = lse + (b * H + h) * S;
          const T* delta_h = delta + (b * H + h) * S;
          for (i64 i = j; i <= last_query_tile; ++i) {
            const i64 r0 = i * t, nq = std::min(t, S - r0);
            load_rows(qb, q + (b * S + r0) * ldq + h * hd, ldq, nq, hd, table, r0, scale);
            tile_product(false, true, nq, nk, hd, qb, hd, kb, hd, false, sb, t);  // scores: (nq, nk), the forward's bits
            for (i64 r = 0; r < nq; ++r) {
              T* prow = sb + r * t;
              const auto [lo, hi] = row_keys(r0 + r, k0, nk, d.window);  // causal and windowed, as in the forward
              exp_shifted_sum(prow + lo, hi - lo, lse_h[r0 + r]);
              for (i64 c = 0; c < lo; ++c) prow[c] = T(0);
              for (i64 c = hi; c < nk; ++c) prow[c] = T(0);
            }
            const T* dO;  // (nq, hd), row stride lddo
            i64 lddo;
            if constexpr (widened) {
              load_rows(dob, dout + (b * S + r0) * ldo + h * hd, ldo, nq, hd, static_cast<const T*>(nullptr), r0, T(1));
              dO = dob;
              lddo = hd;
            } else {
              dO = dout + (b * S + r0) * ldo + h * hd;
              lddo = ldo;
            }
            tile_product(true, false, nk, hd, nq, sb, t, dO, lddo, true, dvb, hd);   // dV += P^T dO
            tile_product(false, true, nq, nk, hd, dO, lddo, vb, hd, false, pb, t);   // dP = dO V^T
            for (i64 r = 0; r < nq; ++r) {  // dS = P (dP - delta), in place of P
              T* srow = sb + r * t;
              const T* dprow = pb + r * t;
              const T dr = delta_h[r0 + r];
              for (i64 c = 0; c < nk; ++c) srow[c] = srow[c] * (dprow[c] - dr);
            }
            tile_product(true, false, nk, hd, nq, sb, t, qb, hd, true, dkb, hd);  // dK += dS^T Q; Q carries the scale
            tile_product(false, false, nq, hd, nk, sb, t, kb, hd, true, dq_rows(b, h, h0) + r0 * lddqa, lddqa);  // dQ += dS K, scale at the end
          }
        }
        store_rows_inverse(dk + (b * S + k0) * lddk + g * hd, lddk, dkb, hd, nk, hd, table, k0, T(1));
        store_rows_inverse(dv + (b * S + k0) * lddv + g * hd, lddv, dvb, hd, nk, hd, static_cast<const T*>(nullptr),
                           k0, T(1));
      }
      for (i64 h = h0; h < h0 + rep; ++h)  // dq_rot -> dq: times scale, rotated back (in place unless widened)
        store_rows_inverse(dq + b * S * lddq + h * hd, lddq, dq_rows(b, h, h0), lddqa, S, hd, table, 0, scale);
    });
  });
}

// ---------------------------------------------------------------------------
// Incremental decoding: one new token at position pos of every sequence.
//   q_row: (batch, heads * hd) un-rotated; k_new, v_new: (batch, kv_heads * hd) un-rotated
//   k_cache, v_cache: (batch, kv_heads, max_seq, hd), keys stored rotated; this
//   call writes row pos (k_new rotated, v_new), then attends over 0..pos
//   (with a sliding window, over pos - window + 1 .. pos: older rows are not read).
//   out: (batch, heads * hd); scratch: attention_decode_scratch(d, max_seq, workers)
// d.seq is not used (max_seq and pos say where the token is).
template <class T>
void attention_decode(const AttentionDims& d, std::int64_t max_seq, std::int64_t pos, const T* q_row, const T* k_new,
                      const T* v_new, T* k_cache, T* v_cache, T* out, T* scratch, int workers) {
  using namespace detail;
  check_scalar<T>();
  check_attention_dims(d, "attention_decode");
  check_workers(workers, "attention_decode");
  if (pos < 0 || pos >= max_seq) throw std::invalid_argument("attention_decode: pos must be in [0, max_seq)");
  const i64 B = d.batch, H = d.heads, KV = d.kv_heads, hd = d.head_dim, rep = H / KV;
  if (B == 0) return;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  const i64 per_worker = max_seq + 2 * hd;
  const i64 j0 = attention_window_start(pos, d.window), n = pos + 1 - j0;  // the keys pos attends to: j0 .. pos

  attention_team(workers, [&](int w) {
    T* sc = scratch + w * per_worker;  // scores, then probabilities: (n)
    T* qv = sc + max_seq;              // q rotated, times scale: (hd)
    T* acc = qv + hd;                  // sum_j p_j v_j: (hd)
    for_items(B * KV, [&](i64 item) {  // append; the loop's barrier orders it before the reads
      const i64 b = item / KV, g = item % KV;
      const i64 row = ((b * KV + g) * max_seq + pos) * hd;
      const T* kn = k_new + (b * KV + g) * hd;
      const T* vn = v_new + (b * KV + g) * hd;
      if (d.rope) rotate_one(k_cache + row, kn, hd, pos, d.rope_theta, d.rope_scaling, T(1));
      else for (i64 c = 0; c < hd; ++c) k_cache[row + c] = kn[c];
      for (i64 c = 0; c < hd; ++c) v_cache[row + c] = vn[c];
    });
    for_items(B * H, [&](i64 item) {
      const i64 b = item / H, h = item % H, g = h / rep;
      const T* kc = k_cache + (b * KV + g) * max_seq * hd;  // (max_seq, hd)
      const T* vc = v_cache + (b * KV + g) * max_seq * hd;  // (max_seq, hd)
      const T* qs = q_row + (b * H + h) * hd;
      if (d.rope) rotate_one(qv, qs, hd, pos, d.rope_theta, d.rope_scaling, scale);
      else for (i64 c = 0; c < hd; ++c) qv[c] = qs[c] * scale;
      for (i64 j = 0; j < n; ++j) sc[j] = dot(qv, kc + (j0 + j) * hd, hd);
      const T m = max_of(sc, n);
      const T l = exp_shifted_sum(sc, n, m);
      for (i64 c = 0; c < hd; ++c) acc[c] = T(0);
      for (i64 j = 0; j < n; ++j) {
        const T p = sc[j];
        const T* vrow = vc + (j0 + j) * hd;
        for (i64 c = 0; c < hd; ++c) acc[c] += p * vrow[c];
      }
      const T inv = T(1) / l;
      T* orow = out + (b * H + h) * hd;
      for (i64 c = 0; c < hd; ++c) orow[c] = acc[c] * inv;
    });
  });
}

}  // namespace headroom::host
