// Tests of the CUDA subset the kernels use (docs/cuda.md), with kernels
// defined here: reductions, shared memory and barriers, shuffles, early
// returns, atomics, wmma and the built-in indices. Built by g++ against the
// CPU emulator they test the emulator; built by nvcc they check the same
// expectations on a GPU. The last tests (emulator only) check that the
// emulator reports kernel bugs: barriers in divergent code, exceptions,
// invalid launches.
#include "../support/kernel_test.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

// A named namespace: Catch2's TEST_CASE opens an anonymous one, and nvcc's
// generated stubs cannot name kernels in an anonymous namespace nested in another.
namespace headroom::emulator_selftest {

using cuda::bf16;
using cuda_test::Buffer;

constexpr cudaStream_t stream = nullptr;

// --- block_sum / block_max / warp_sum ---------------------------------------

// x: (blocks, Threads); every thread writes what it got from each reduction.
template <int Threads>
__global__ void reduce_block(const float* x, float* sums, float* maxes, float* warp_sums) {
  __shared__ float scratch[32];
  const int i = blockIdx.x * Threads + threadIdx.x;
  const float v = x[i];
  warp_sums[i] = cuda::warp_sum(v);
  sums[i] = cuda::block_sum<Threads>(v, scratch);
  maxes[i] = cuda::block_max<Threads>(v, scratch);
}

// Odd multiples of 1/8 in (-8, 8): every partial sum is exact in f32, so
// any summation order gives the exact sum. The last block is all negative
// (block_max must not start from 0).
std::vector<float> odd_eighths(int blocks, int threads) {
  std::vector<float> x(static_cast<std::size_t>(blocks) * threads);
  std::uint32_t s = 12345u + threads;
  for (std::size_t i = 0; i < x.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    const int k = static_cast<int>(s >> 26) - 32;  // [-32, 32)
    x[i] = (2 * k + 1) / 8.0f;
    if (i / threads == static_cast<std::size_t>(blocks - 1)) x[i] = -std::fabs(x[i]) - 1.0f;
  }
  return x;
}

template <int Threads>
void check_reductions() {
  INFO("threads per block: " << Threads);
  constexpr int blocks = 3;
  const std::vector<float> x = odd_eighths(blocks, Threads);
  Buffer<float> dx(x), sums(x.size()), maxes(x.size()), warp_sums(x.size());
  cuda::launch(reduce_block<Threads>, "reduce_block", dim3(blocks), dim3(Threads), stream, dx.get(), sums.get(), maxes.get(), warp_sums.get());
  const std::vector<float> got_sums = sums.download(), got_maxes = maxes.download(), got_warp_sums = warp_sums.download();
  for (int b = 0; b < blocks; ++b) {
    const auto first = x.begin() + b * Threads;
    const double sum = std::accumulate(first, first + Threads, 0.0);
    const float max = *std::max_element(first, first + Threads);
    for (int t = 0; t < Threads; ++t) {
      const std::size_t i = static_cast<std::size_t>(b) * Threads + t;
      const auto warp_first = first + t / 32 * 32;
      const double warp_sum = std::accumulate(warp_first, warp_first + 32, 0.0);
      INFO("block " << b << ", thread " << t);
      REQUIRE(got_sums[i] == sum);
      REQUIRE(got_maxes[i] == max);
      REQUIRE(got_warp_sums[i] == warp_sum);
    }
  }
}

TEST_CASE("emulator: block_sum, block_max and warp_sum give every thread the exact result", "[emulator]") {
  check_reductions<32>();
  check_reductions<96>();
  check_reductions<256>();
  check_reductions<1024>();
}

// --- shared memory and __syncthreads ----------------------------------------

constexpr int transpose_tile = 32;

// out (cols, rows) = in (rows, cols)^T through a (32, 33) shared tile; a
// block of (32, 8) threads moves one 32 x 32 tile. WithBarrier = false is the
// racy version (emulator only: on a GPU its result is undefined).
template <bool WithBarrier>
__global__ void transpose(const float* in, float* out, int rows, int cols) {
  __shared__ float tile[transpose_tile][transpose_tile + 1];
  const int col = blockIdx.x * transpose_tile + threadIdx.x;
  for (int j = threadIdx.y; j < transpose_tile; j += blockDim.y) {
    const int row = blockIdx.y * transpose_tile + j;
    if (row < rows && col < cols) tile[j][threadIdx.x] = in[row * cols + col];
  }
  if (WithBarrier) __syncthreads();
  const int out_col = blockIdx.y * transpose_tile + threadIdx.x;
  for (int j = threadIdx.y; j < transpose_tile; j += blockDim.y) {
    const int out_row = blockIdx.x * transpose_tile + j;
    if (out_row < cols && out_col < rows) out[out_row * rows + out_col] = tile[threadIdx.x][j];
  }
}

template <bool WithBarrier>
std::vector<float> transposed_on_device(const std::vector<float>& in, int rows, int cols) {
  Buffer<float> din(in), dout(in.size());
  const dim3 grid(cuda::ceil_div(cols, transpose_tile), cuda::ceil_div(rows, transpose_tile));
  cuda::launch(transpose<WithBarrier>, "transpose", grid, dim3(transpose_tile, 8), stream, din.get(), dout.get(), rows, cols);
  return dout.download();
}

std::vector<float> transposed(const std::vector<float>& in, int rows, int cols) {
  std::vector<float> out(in.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  return out;
}

TEST_CASE("emulator: a shared-memory transpose of a 70 x 45 matrix", "[emulator]") {
  const int rows = 70, cols = 45;
  const std::vector<float> in = cuda_test::pattern(rows * cols, 7);
  REQUIRE(transposed_on_device<true>(in, rows, cols) == transposed(in, rows, cols));
}

// --- shuffles ----------------------------------------------------------------

enum class Shuffle { idx, up, down, xor_ };
struct ShuffleCase {
  Shuffle kind;
  int b;  // source lane, delta or lane mask
  int width;
};
// The cases shuffle_cases() runs, in its order; src_lane (lane * 5 + 3) for idx
// is marked b = -1.
constexpr ShuffleCase shuffle_table[] = {
    {Shuffle::idx, -1, 32}, {Shuffle::idx, 0, 32}, {Shuffle::idx, 9, 8},   {Shuffle::up, 3, 32},  {Shuffle::up, 2, 16},
    {Shuffle::down, 5, 32}, {Shuffle::down, 3, 8}, {Shuffle::xor_, 6, 32}, {Shuffle::xor_, 1, 4}, {Shuffle::xor_, 8, 8},
};
constexpr int shuffle_case_count = sizeof(shuffle_table) / sizeof(shuffle_table[0]);

// in, out: (cases, threads) for out. Two warps, so a value from the wrong warp shows.
template <class T>
__global__ void shuffle_cases(const T* in, T* out) {
  const unsigned full = cuda::full_mask;
  const int t = threadIdx.x, lane = t % 32, n = blockDim.x;
  const T v = in[t];
  out[0 * n + t] = __shfl_sync(full, v, lane * 5 + 3);  // beyond 31: modulo the width
  out[1 * n + t] = __shfl_sync(full, v, 0);
  out[2 * n + t] = __shfl_sync(full, v, 9, 8);
  out[3 * n + t] = __shfl_up_sync(full, v, 3);
  out[4 * n + t] = __shfl_up_sync(full, v, 2, 16);
  out[5 * n + t] = __shfl_down_sync(full, v, 5);
  out[6 * n + t] = __shfl_down_sync(full, v, 3, 8);
  out[7 * n + t] = __shfl_xor_sync(full, v, 6);
  out[8 * n + t] = __shfl_xor_sync(full, v, 1, 4);
  out[9 * n + t] = __shfl_xor_sync(full, v, 8, 8);  // reaches the earlier group only
}

// The lane whose value `lane` gets, from the CUDA programming guide's rules:
// a segment is `width` lanes; idx takes src modulo width in the segment; up,
// down and xor outside the segment give the caller's own value, except that
// xor may reach an earlier segment.
int shuffle_source(const ShuffleCase& c, int lane) {
  const int segment = lane / c.width * c.width;
  switch (c.kind) {
    case Shuffle::idx:
      return segment + (c.b < 0 ? lane * 5 + 3 : c.b) % c.width;
    case Shuffle::up:
      return lane - c.b >= segment ? lane - c.b : lane;
    case Shuffle::down:
      return lane + c.b < segment + c.width ? lane + c.b : lane;
    case Shuffle::xor_:
      return (lane ^ c.b) < segment + c.width ? lane ^ c.b : lane;
  }
  return lane;
}

template <class T>
void check_shuffles(const std::vector<T>& values) {
  const int threads = static_cast<int>(values.size());
  Buffer<T> in(values), out(static_cast<std::size_t>(shuffle_case_count) * threads);
  cuda::launch(shuffle_cases<T>, "shuffle_cases", dim3(1), dim3(threads), stream, in.get(), out.get());
  const std::vector<T> got = out.download();
  for (int c = 0; c < shuffle_case_count; ++c)
    for (int t = 0; t < threads; ++t) {
      const int source = t / 32 * 32 + shuffle_source(shuffle_table[c], t % 32);
      INFO("case " << c << ", thread " << t << ", source lane " << source % 32);
      REQUIRE(got[static_cast<std::size_t>(c) * threads + t] == values[source]);
    }
}

TEST_CASE("emulator: __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync, in and out of range", "[emulator]") {
  constexpr int threads = 64;
  std::vector<float> f(threads);
  std::vector<double> d(threads);
  std::vector<int> i(threads);
  std::vector<unsigned> u(threads);
  for (int t = 0; t < threads; ++t) {
    f[t] = 100.0f * (t / 32) + t % 32 + 0.5f;
    d[t] = f[t] + 1e-9 * t;
    i[t] = -7 - t * 3;
    u[t] = 4000000000u - t;
  }
  SECTION("float") { check_shuffles(f); }
  SECTION("double") { check_shuffles(d); }
  SECTION("int") { check_shuffles(i); }
  SECTION("unsigned") { check_shuffles(u); }
}

// --- early return --------------------------------------------------------------

// x: (blocks, 256). Threads t >= live return at once; the rest reverse their
// values through shared memory, double them, and thread 0 adds them up. When
// whole warps return, the rest also sum over their warps.
__global__ void after_early_return(const float* x, float* reversed, float* totals, float* warp_sums, int live) {
  __shared__ float s[256];
  const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
  if (t >= live) return;
  s[t] = x[base + t];
  __syncthreads();
  const float mine = s[live - 1 - t];
  reversed[base + t] = mine;
  __syncthreads();
  s[t] = 2.0f * mine;
  __syncthreads();
  if (t == 0) {
    float total = 0.0f;
    for (int i = 0; i < live; ++i) total += s[i];
    totals[blockIdx.x] = total;
  }
  if (live % cuda::warp_size == 0) warp_sums[base + t] = cuda::warp_sum(mine);
}

TEST_CASE("emulator: threads that return early do not hold up __syncthreads", "[emulator]") {
  constexpr int threads = 256, blocks = 2;
  for (const int live : {1, 64, 100, 255, 256}) {
    INFO("live threads per block: " << live);
    std::vector<float> x(threads * blocks);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) - 40.0f;  // integers: exact sums
    Buffer<float> dx(x), reversed(x.size()), totals(blocks), warp_sums(x.size());
    cuda::launch(after_early_return, "after_early_return", dim3(blocks), dim3(threads), stream, dx.get(), reversed.get(), totals.get(), warp_sums.get(),
                 live);
    const std::vector<float> got = reversed.download(), got_totals = totals.download(), got_warp_sums = warp_sums.download();
    for (int b = 0; b < blocks; ++b) {
      double total = 0;
      for (int t = 0; t < live; ++t) {
        const float want = x[b * threads + live - 1 - t];
        REQUIRE(got[b * threads + t] == want);
        total += 2.0 * want;
      }
      for (int t = live; t < threads; ++t) REQUIRE(got[b * threads + t] == 0.0f);
      REQUIRE(got_totals[b] == total);
      if (live % 32 == 0)
        for (int t = 0; t < live; ++t) {
          double warp_sum = 0;
          for (int l = t / 32 * 32; l < t / 32 * 32 + 32; ++l) warp_sum += got[b * threads + l];
          REQUIRE(got_warp_sums[b * threads + t] == warp_sum);
        }
    }
  }
}

// --- atomics -----------------------------------------------------------------

// Every thread i of the grid adds 0.25 (1 + i % 3) to total, 1 to float bin
// i % 5 and to bf16 bin i % 16, takes a ticket from counter and raises
// largest to a hash of i. All sums are exact in their type.
__global__ void atomics(float* total, float* bins, bf16* bf16_bins, int* counter, int* tickets, int* largest) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(total, 0.25f * static_cast<float>(1 + i % 3));
  atomicAdd(&bins[i % 5], 1.0f);
  atomicAdd(&bf16_bins[i % 16], cuda::from_float<bf16>(1.0f));
  tickets[i] = atomicAdd(counter, 1);
  atomicMax(largest, (i * 7919) % 3989);
}

TEST_CASE("emulator: atomicAdd on float and bf16 from many blocks, atomicAdd's old value, atomicMax", "[emulator]") {
  constexpr int blocks = 37, threads = 96, n = blocks * threads;
  Buffer<float> total(1), bins(5);
  Buffer<bf16> bf16_bins(16);
  Buffer<int> counter(1), tickets(n), largest(std::vector<int>{-5});
  cuda::launch(atomics, "atomics", dim3(blocks), dim3(threads), stream, total.get(), bins.get(), bf16_bins.get(), counter.get(),
               tickets.get(), largest.get());
  double want_total = 0;
  std::vector<float> want_bins(5);
  int want_largest = -5;
  for (int i = 0; i < n; ++i) {
    want_total += 0.25 * (1 + i % 3);
    want_bins[i % 5] += 1.0f;
    want_largest = std::max(want_largest, (i * 7919) % 3989);
  }
  REQUIRE(total.download()[0] == want_total);
  REQUIRE(bins.download() == want_bins);
  for (const float b : cuda_test::to_floats(bf16_bins.download())) REQUIRE(b == n / 16);
  REQUIRE(counter.download()[0] == n);
  std::vector<int> got_tickets = tickets.download();
  std::sort(got_tickets.begin(), got_tickets.end());
  std::vector<int> every_ticket(n);
  std::iota(every_ticket.begin(), every_ticket.end(), 0);
  REQUIRE(got_tickets == every_ticket);
  REQUIRE(largest.download()[0] == want_largest);
}

// --- wmma ----------------------------------------------------------------------

// c (M, N) = a (M, K) b (K, N) + c0 with bf16 a, b and f32 accumulation, by
// 4 warps taking 16 x 16 tiles in turn. b is stored (N, K) row-major (a
// col-major B, like a linear weight) or (K, N) row-major. Also writes
// c_t (N, M) = c^T (a col-major store) and half_ab (M, N) = 0.5 a b through
// shared memory (element-wise scaling of a fragment, a store, __syncwarp).
template <bool BColMajor>
__global__ void __launch_bounds__(128)
    wmma_gemm(const bf16* a, const bf16* b, const float* c0, float* c, float* c_t, float* half_ab, int m, int n, int k) {
  using namespace nvcuda;
  using BLayout = std::conditional_t<BColMajor, wmma::col_major, wmma::row_major>;
  constexpr int warps = 4;
  __shared__ __align__(32) float staging[warps][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles_n = n / 16, tiles = m / 16 * tiles_n;
  for (int tile = warp; tile < tiles; tile += warps) {
    const int i0 = tile / tiles_n * 16, j0 = tile % tiles_n * 16;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BLayout> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> ab, acc;
    wmma::fill_fragment(ab, 0.0f);
    for (int k0 = 0; k0 < k; k0 += 16) {
      wmma::load_matrix_sync(fa, a + i0 * k + k0, k);
      if constexpr (BColMajor) {
        wmma::load_matrix_sync(fb, b + j0 * k + k0, k);
      } else {
        wmma::load_matrix_sync(fb, b + k0 * n + j0, n);
      }
      wmma::mma_sync(ab, fa, fb, ab);
    }
    wmma::load_matrix_sync(acc, c0 + i0 * n + j0, n, wmma::mem_row_major);
    for (int e = 0; e < acc.num_elements; ++e) acc.x[e] += ab.x[e];
    wmma::store_matrix_sync(c + i0 * n + j0, acc, n, wmma::mem_row_major);
    wmma::store_matrix_sync(c_t + j0 * m + i0, acc, m, wmma::mem_col_major);
    for (int e = 0; e < ab.num_elements; ++e) ab.x[e] *= 0.5f;
    wmma::store_matrix_sync(staging[warp], ab, 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 16; e += 32) half_ab[(i0 + e / 16) * n + j0 + e % 16] = staging[warp][e];
    __syncwarp();  // staging[warp] is rewritten for the next tile
  }
}

template <bool BColMajor>
void check_wmma_gemm() {
  INFO((BColMajor ? "B col-major (stored (N, K))" : "B row-major (stored (K, N))"));
  constexpr int m = 32, n = 48, k = 64;
  const std::vector<float> a = cuda_test::rounded<bf16>(cuda_test::pattern(m * k, 11));
  const std::vector<float> b = cuda_test::rounded<bf16>(cuda_test::pattern(k * n, 12));  // as stored
  const std::vector<float> c0 = cuda_test::pattern(m * n, 13);
  auto b_at = [&](int kk, int j) { return double(BColMajor ? b[j * k + kk] : b[kk * n + j]); };
  Buffer<bf16> da(cuda_test::to_storage<bf16>(a)), db(cuda_test::to_storage<bf16>(b));
  Buffer<float> dc0(c0), dc(m * n), dc_t(m * n), dhalf(m * n);
  cuda::launch(wmma_gemm<BColMajor>, "wmma_gemm", dim3(1), dim3(128), stream, da.get(), db.get(), dc0.get(), dc.get(), dc_t.get(), dhalf.get(),
               m, n, k);
  const std::vector<float> c = dc.download(), c_t = dc_t.download(), half_ab = dhalf.download();
  // f32 accumulation of 64 exact products: error well below 1e-4 sum |a||b|.
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double ab = 0, scale = std::fabs(c0[i * n + j]);
      for (int kk = 0; kk < k; ++kk) {
        ab += a[i * k + kk] * b_at(kk, j);
        scale += std::fabs(a[i * k + kk] * b_at(kk, j));
      }
      INFO("c(" << i << ", " << j << ")");
      REQUIRE(std::fabs(c[i * n + j] - (ab + c0[i * n + j])) <= 1e-4 * scale);
      REQUIRE(c_t[j * m + i] == c[i * n + j]);
      REQUIRE(std::fabs(half_ab[i * n + j] - 0.5 * ab) <= 1e-4 * scale);
    }
}

TEST_CASE("emulator: a 32 x 48 x 64 bf16 wmma GEMM against a double reference", "[emulator]") {
  check_wmma_gemm<true>();
  check_wmma_gemm<false>();
}

// --- built-in indices ------------------------------------------------------------

constexpr int index_fields = 12;

// Every thread writes its threadIdx, blockIdx, blockDim and gridDim (after a
// __syncthreads) at its place in the grid: records (blocks, threads, 12).
// With warp sums, also the sum of the linear thread ids of its warp.
__global__ void indices(int* records, int* warp_id_sums, bool warp_sums) {
  const int linear_thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int linear_block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  __syncthreads();
  int* r = records + (static_cast<std::size_t>(linear_block) * threads + linear_thread) * index_fields;
  const unsigned fields[index_fields] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                                         blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int f = 0; f < index_fields; ++f) r[f] = static_cast<int>(fields[f]);
  if (warp_sums)
    warp_id_sums[linear_block * threads + linear_thread] = static_cast<int>(cuda::warp_sum(static_cast<float>(linear_thread)));
}

void check_indices(dim3 grid, dim3 block) {
  INFO("grid (" << grid.x << ", " << grid.y << ", " << grid.z << "), block (" << block.x << ", " << block.y << ", " << block.z
                << ")");
  const int threads = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
  const bool warp_sums = threads % 32 == 0;
  Buffer<int> records(static_cast<std::size_t>(blocks) * threads * index_fields),
      sums(static_cast<std::size_t>(blocks) * threads);
  cuda::launch(indices, "indices", grid, block, stream, records.get(), sums.get(), warp_sums);
  const std::vector<int> got = records.download(), got_sums = sums.download();
  std::size_t at = 0;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx, ++at) {
              const std::vector<int> want = {int(tx),      int(ty),      int(tz),      int(bx),     int(by),     int(bz),
                                             int(block.x), int(block.y), int(block.z), int(grid.x), int(grid.y), int(grid.z)};
              INFO("record " << at);
              REQUIRE(std::vector<int>(got.begin() + at * index_fields, got.begin() + (at + 1) * index_fields) == want);
              if (warp_sums) {
                const int warp_first = static_cast<int>(at % threads) / 32 * 32;
                REQUIRE(got_sums[at] == 32 * warp_first + 31 * 32 / 2);  // 32 consecutive linear ids
              }
            }
}

TEST_CASE("emulator: 2D and 3D grids and blocks see their threadIdx, blockIdx, blockDim, gridDim", "[emulator]") {
  check_indices(dim3(3, 2, 2), dim3(5, 3, 2));  // 30 threads: a partial warp
  check_indices(dim3(2, 1, 3), dim3(4, 4, 4));  // warps of 32 consecutive linear ids
  check_indices(dim3(4, 3), dim3(16, 2));
}

// --- what only the emulator checks -------------------------------------------------

#if !defined(__CUDACC__)

namespace emulator = headroom::cuda_emulator;

// Lanes 0-15 of warp 0 wait at __syncthreads while lanes 16-31 wait in a
// shuffle: neither barrier can complete.
__global__ void divergent_barrier(float* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = cuda::warp_sum(1.0f);
  }
}

__global__ void divergent_warp_collectives(float* out) {
  if (threadIdx.x % 2 == 0) {
    __syncwarp();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(cuda::full_mask, 1.0f, 1);
  }
}

__global__ void throws_in_block_1(float* out) {
  if (blockIdx.x == 1 && threadIdx.x == 37) throw std::runtime_error("kernel failure in thread 37");
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

__global__ void shuffle_without_own_lane(float* out) { out[threadIdx.x] = __shfl_sync(0xfffffffeu, 1.0f, 0); }

// 40 threads: warp 1 has lanes 0-7 only; lane 0 reads lane 16.
__global__ void shuffle_from_missing_lane(float* out) { out[threadIdx.x] = __shfl_down_sync(cuda::full_mask, 1.0f, 16); }

__global__ void empty_kernel() {}

TEST_CASE("emulator: a barrier in divergent code throws std::logic_error naming the launch and block", "[emulator]") {
  Buffer<float> out(64);
  REQUIRE_THROWS_AS(cuda::launch(divergent_barrier, "divergent_barrier", dim3(2), dim3(64), stream, out.get()), std::logic_error);
  REQUIRE_THROWS_WITH(
      cuda::launch(divergent_barrier, "divergent_barrier", dim3(2), dim3(64), stream, out.get()),
      Catch::Contains("deadlock") && Catch::Contains("block (0, 0, 0) of the launch grid (2, 1, 1) x block (64, 1, 1)"));
  REQUIRE_THROWS_WITH(cuda::launch(divergent_warp_collectives, "divergent_warp_collectives", dim3(1), dim3(32), stream, out.get()),
                      Catch::Contains("divergent warp collectives"));
  REQUIRE_THROWS_WITH(cuda::launch(shuffle_without_own_lane, "shuffle_without_own_lane", dim3(1), dim3(32), stream, out.get()),
                      Catch::Contains("lacks the calling lane 0"));
  REQUIRE_THROWS_WITH(__syncthreads(), Catch::Contains("outside a kernel"));
}

TEST_CASE("emulator: a kernel's exception leaves the launch, and the next launch runs", "[emulator]") {
  Buffer<float> out(3 * 64);
  REQUIRE_THROWS_WITH(cuda::launch(throws_in_block_1, "throws_in_block_1", dim3(3), dim3(64), stream, out.get()), "kernel failure in thread 37");
  const std::vector<float> after_failure = out.download();
  REQUIRE(std::count(after_failure.begin(), after_failure.end(), 1.0f) == 64);  // block 0 ran; block 1 stopped; block 2 never ran
  check_reductions<96>();
}

// A kernel only the dynamic shared memory test raises the limit of (the limit belongs to the kernel).
__global__ void opted_in_kernel() {}

// What CUDA does with a configuration it refuses: nothing runs, and the error
// (cudaErrorInvalidConfiguration; cudaErrorInvalidValue for dynamic shared
// memory above the kernel's limit) waits for cudaGetLastError. cuda::launch
// checks every launch and throws cuda_error naming the kernel and the shape.
TEST_CASE("emulator: launches a GPU refuses do nothing, cuda::launch throws naming the kernel, launch_count counts launches",
          "[emulator][launch]") {
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::uint64_t before = emulator::launch_count();
  cuda::launch(empty_kernel, "empty_kernel", dim3(2, 3), dim3(1024), stream);
  REQUIRE(emulator::launch_count() == before + 1);
  // the emulator alone: an H200's limits
  const std::pair<dim3, dim3> refused[] = {
      {dim3(1), dim3(1025)},       {dim3(1), dim3(1, 1, 65)},  {dim3(1), dim3(32, 64)},   {dim3(1), dim3(0)},
      {dim3(0), dim3(32)},         {dim3(1, 65536), dim3(32)}, {dim3(1, 1, 65536), dim3(32)},
      {dim3(2147483648u), dim3(32)},
  };
  for (const auto& [grid, block] : refused) {
    INFO("grid (" << grid.x << ", " << grid.y << ", " << grid.z << ") block (" << block.x << ", " << block.y << ", " << block.z << ")");
    emulator::run(empty_kernel, grid, block, 0, stream);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  CHECK_THROWS_WITH(cuda::launch(empty_kernel, "empty_kernel", dim3(1), dim3(1025), stream),
                    Catch::Contains("empty_kernel") && Catch::Contains("cudaErrorInvalidConfiguration") &&
                        Catch::Contains("block (1025, 1, 1)"));
  CHECK_THROWS_WITH(cuda::launch(empty_kernel, "empty_kernel", dim3(1, 65536), dim3(32), stream),
                    Catch::Contains("grid (1, 65536, 1)"));
  CHECK_THROWS_AS(cuda::launch(empty_kernel, "empty_kernel", dim3(0), dim3(32), stream), cuda::cuda_error);
  CHECK(cudaGetLastError() == cudaSuccess);  // each check consumed its error
  // dynamic shared memory: up to 48 KiB as is, up to 227 KiB once the kernel opts in
  cuda::launch_with_shared(empty_kernel, "empty_kernel", dim3(1), dim3(32), 48 << 10, stream);
  CHECK_THROWS_WITH(cuda::launch_with_shared(empty_kernel, "empty_kernel", dim3(1), dim3(32), (48 << 10) + 1, stream),
                    Catch::Contains("empty_kernel") && Catch::Contains("cudaErrorInvalidValue") && Catch::Contains("49153 B"));
  const void* opted = reinterpret_cast<const void*>(&opted_in_kernel);
  REQUIRE(cudaFuncSetAttribute(opted, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10) == cudaSuccess);
  cuda::launch_with_shared(opted_in_kernel, "opted_in_kernel", dim3(1), dim3(32), 100 << 10, stream);
  CHECK_THROWS_AS(cuda::launch_with_shared(opted_in_kernel, "opted_in_kernel", dim3(1), dim3(32), (100 << 10) + 1, stream),
                  cuda::cuda_error);
  CHECK(cudaFuncSetAttribute(opted, cudaFuncAttributeMaxDynamicSharedMemorySize, (227 << 10) + 1) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(opted, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10) == cudaSuccess);
  cuda::launch_with_shared(opted_in_kernel, "opted_in_kernel", dim3(1), dim3(32), 227 << 10, stream);
  cuda_test::sync();
  CHECK(emulator::launch_count() == before + 4);
}

TEST_CASE("emulator: a shuffle from a lane that does not exist gives NaN", "[emulator]") {
  Buffer<float> out(40);
  cuda::launch(shuffle_from_missing_lane, "shuffle_from_missing_lane", dim3(1), dim3(40), stream, out.get());
  const std::vector<float> got = out.download();
  for (int t = 0; t < 16; ++t) REQUIRE(got[t] == 1.0f);       // reads lane t + 16 of warp 0
  for (int t = 16; t < 32; ++t) REQUIRE(got[t] == 1.0f);      // out of range: own value
  for (int t = 32; t < 40; ++t) REQUIRE(std::isnan(got[t]));  // lanes 16-23 of warp 1 do not exist
}

// cuda::warp_sum and warp_max run here as one warp collective each
// (Scheduler::xor_butterfly): every lane must get what the shuffle loop they
// stand for gives it, bit for bit, also where lanes returned (they read as
// NaN) or do not exist. Lanes at or above `live` in their warp return first.
__global__ void butterflies(const float* x, float* out, int live) {
  const int t = threadIdx.x;
  if (t % 32 >= live) return;
  const float v = x[t];
  float s = v, m = v;
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(cuda::full_mask, s, o);
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(cuda::full_mask, m, o);
    m = w > m ? w : m;
  }
  out[4 * t] = s;
  out[4 * t + 1] = cuda::warp_sum(v);
  out[4 * t + 2] = m;
  out[4 * t + 3] = cuda::warp_max(v);
}

TEST_CASE("emulator: warp_sum and warp_max give each lane the shuffle loop's bits", "[emulator]") {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[static_cast<std::size_t>(i)] = std::sin(1.7f * static_cast<float>(i)) * 1e3f + 0.1f * i;  // sums that round
  const Buffer<float> dx(x);
  for (const auto& [threads, live] : {std::pair{64, 32}, std::pair{64, 20}, std::pair{40, 32}}) {
    INFO(threads << " threads, " << live << " live lanes per warp");
    Buffer<float> out(4 * 64);
    cuda::launch(butterflies, "butterflies", dim3(1), dim3(threads), stream, dx.get(), out.get(), live);
    const std::vector<float> got = out.download();
    for (int t = 0; t < threads; ++t) {
      if (t % 32 >= live) continue;
      INFO("thread " << t);
      const float* g = &got[static_cast<std::size_t>(4 * t)];
      CHECK(std::bit_cast<std::uint32_t>(g[1]) == std::bit_cast<std::uint32_t>(g[0]));
      CHECK(std::bit_cast<std::uint32_t>(g[3]) == std::bit_cast<std::uint32_t>(g[2]));
    }
    if (threads == 64 && live == 32) CHECK(got[0] != got[4 * 32]);  // the two warps sum their own lanes
  }
}

TEST_CASE("emulator: the fiber order exposes a missing __syncthreads", "[emulator]") {
  const int rows = 70, cols = 45;
  const std::vector<float> in = cuda_test::pattern(rows * cols, 8);
  REQUIRE(transposed_on_device<false>(in, rows, cols) != transposed(in, rows, cols));
}

#endif  // !defined(__CUDACC__)

}  // namespace headroom::emulator_selftest
