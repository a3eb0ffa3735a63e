// Tests of the runtime and cuBLASLt calls the engine makes: cuda::Blas::gemm
// (cuda/blas.cuh) in all four transpose combinations, f32 and bf16, beta 0
// and 1, with the bias and bias + GELU epilogues, odd shapes and padded
// leading dimensions, against a double reference computed here. Built by g++
// they test the emulator (tests/cuda/emulator/runtime_emulator.hpp); built by
// nvcc they check the same expectations against cuBLASLt on a GPU, so the two
// agree on layouts, epilogue order and what beta = 0 reads. The last tests
// (emulator only) check the emulated runtime itself: allocation counting,
// copy and memset semantics, the errors it reports, cuBLASLt's validation.
#include "../support/kernel_test.hpp"

#if !defined(__CUDACC__)
#include "../emulator/runtime_emulator.hpp"
#endif

#include <headroom/cuda/blas.cuh>
#include <headroom/math/activations.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace headroom::runtime_emulator_selftest {

using cuda::bf16;
using cuda::GemmEpilogue;
using cuda::Trans;
using cuda_test::Buffer;
using i64 = std::int64_t;

constexpr cudaStream_t stream = nullptr;
constexpr std::size_t workspace_bytes = std::size_t{4} << 20;
// Written into the padding columns of C and pre: a GEMM must leave it there.
constexpr float padding = 7.0f;

// Tolerance per element, |got - reference| <= out_rtol |reference| + sum_rtol magnitude,
// where magnitude = |alpha| sum_q |a b| + |beta c| + |bias| bounds the terms:
//   sum_rtol = 1e-5: the GPU sums k <= 64 products in f32 (at most ~k 2^-24
//     = 4e-6 relative to the magnitude); the emulator sums in double.
//   out_rtol: the one rounding of the output to S, half an ulp: 2^-24 for
//     f32, 2^-8 for bf16.
// GELU's slope is at most 1.13, so the error of the pre-activation passes to
// gelu(pre) scaled by 1.2 at most; for bf16 it includes the rounding of the
// auxiliary output in case the GPU applies GELU to the rounded value. The
// GPU's GELU may also use the hardware tanh (tanh.approx.f32, relative error
// about 2^-11): gelu = 0.5 pre (1 + tanh), so 2^-11 |pre| more.
template <class S>
constexpr double out_rtol = std::is_same_v<S, float> ? 1.0 / (1 << 24) : 1.0 / (1 << 8);
constexpr double sum_rtol = 1e-5;
constexpr double gelu_slope_bound = 1.2;
constexpr double gelu_tanh_rtol = 1.0 / (1 << 11);

struct GemmCase {
  Trans ta = Trans::no, tb = Trans::no;
  i64 m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::none;
  i64 lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // leading dimensions beyond the stored widths
  i64 bias_offset = 0, pre_offset = 0;        // bytes past a 64-byte boundary where the bias and pre start

  std::string describe() const {
    return std::string(ta == Trans::yes ? "A^T" : "A") + (tb == Trans::yes ? " B^T" : " B") + ", m=" + std::to_string(m) +
           " n=" + std::to_string(n) + " k=" + std::to_string(k) + ", alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta) + ", epilogue " + std::to_string(static_cast<int>(epilogue)) + ", ld pads " +
           std::to_string(lda_pad) + "/" + std::to_string(ldb_pad) + "/" + std::to_string(ldc_pad) + ", bias at +" +
           std::to_string(bias_offset) + " B, pre at +" + std::to_string(pre_offset) + " B";
  }
};

// Runs one GEMM through Blas on S-rounded inputs and compares C (and pre)
// with the double reference; the padding of C and pre must be untouched.
// With beta = 0, C starts as NaN: cuBLASLt does not read C then.
template <class S>
void check_gemm(cuda::Blas& blas, const GemmCase& g, std::uint32_t seed) {
  INFO(g.describe() << (std::is_same_v<S, float> ? ", float" : ", bf16"));
  const bool bias_on = g.epilogue != GemmEpilogue::none, gelu = g.epilogue == GemmEpilogue::gelu_aux_bias;
  // row-major storage: A (m, k) or, transposed, (k, m); B (k, n) or (n, k); C and pre (m, n)
  const i64 a_rows = g.ta == Trans::no ? g.m : g.k, a_cols = g.ta == Trans::no ? g.k : g.m;
  const i64 b_rows = g.tb == Trans::no ? g.k : g.n, b_cols = g.tb == Trans::no ? g.n : g.k;
  const i64 lda = a_cols + g.lda_pad, ldb = b_cols + g.ldb_pad, ldc = g.n + g.ldc_pad;
  const auto size = [](i64 rows, i64 ld) { return static_cast<std::size_t>(rows * ld); };
  const std::vector<float> a = cuda_test::rounded<S>(cuda_test::pattern(size(a_rows, lda), seed));
  const std::vector<float> b = cuda_test::rounded<S>(cuda_test::pattern(size(b_rows, ldb), seed + 1));
  const std::vector<float> bias = cuda_test::rounded<S>(cuda_test::pattern(static_cast<std::size_t>(g.n), seed + 2));
  const std::vector<float> c_start = cuda_test::rounded<S>(cuda_test::pattern(size(g.m, ldc), seed + 3));
  std::vector<float> c(size(g.m, ldc), padding);
  for (i64 i = 0; i < g.m; ++i)
    for (i64 j = 0; j < g.n; ++j)
      c[i * ldc + j] = g.beta != 0.0f ? c_start[i * ldc + j] : std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> pre(size(g.m, ldc), padding);

  Buffer<S> da(cuda_test::to_storage<S>(a)), db(cuda_test::to_storage<S>(b)), dc(cuda_test::to_storage<S>(c));
  // bias and pre `offset` bytes past an address aligned to 64 bytes and no
  // more (an odd multiple of 64) inside a larger buffer: what an algorithm
  // chosen for them remembers does not depend on where the heap put the buffer
  constexpr i64 slack = 256 / sizeof(S);
  Buffer<S> dbias(bias.size() + slack), dpre(pre.size() + slack);
  auto start = [](const Buffer<S>& buf, i64 offset) {
    const auto address = reinterpret_cast<std::uintptr_t>(buf.get());
    return static_cast<i64>((192 - address % 128) % 128 + static_cast<std::uintptr_t>(offset)) / static_cast<i64>(sizeof(S));
  };
  const i64 bias_at = start(dbias, g.bias_offset), pre_at = start(dpre, g.pre_offset);
  {
    std::vector<float> room(bias.size() + slack, padding);
    std::copy(bias.begin(), bias.end(), room.begin() + bias_at);
    dbias.upload(cuda_test::to_storage<S>(room));
    room.assign(pre.size() + slack, padding);
    std::copy(pre.begin(), pre.end(), room.begin() + pre_at);
    dpre.upload(cuda_test::to_storage<S>(room));
  }
  blas.gemm<S>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, da.get(), lda, db.get(), ldb, g.beta, dc.get(), ldc, stream, g.epilogue,
               bias_on ? dbias.get() + bias_at : nullptr, gelu ? dpre.get() + pre_at : nullptr);
  const std::vector<float> got_c = cuda_test::to_floats(dc.download());
  const std::vector<float> pre_room = cuda_test::to_floats(dpre.download());
  const std::vector<float> got_pre(pre_room.begin() + pre_at, pre_room.begin() + pre_at + static_cast<i64>(pre.size()));

  double worst_c = 0, worst_pre = 0;
  for (i64 i = 0; i < g.m; ++i)
    for (i64 j = 0; j < g.n; ++j) {
      double sum = 0, magnitude = 0;
      for (i64 q = 0; q < g.k; ++q) {
        const double x = g.ta == Trans::no ? a[i * lda + q] : a[q * lda + i];
        const double y = g.tb == Trans::no ? b[q * ldb + j] : b[j * ldb + q];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      double value = double(g.alpha) * sum;
      magnitude *= std::fabs(double(g.alpha));
      if (g.beta != 0.0f) {
        value += double(g.beta) * c_start[i * ldc + j];
        magnitude += std::fabs(double(g.beta) * c_start[i * ldc + j]);
      }
      if (bias_on) {
        value += bias[j];
        magnitude += std::fabs(bias[j]);
      }
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      double expected = value, allowed = out_rtol<S> * std::fabs(value) + sum_rtol * magnitude;
      if (gelu) {
        const double r_pre = std::fabs(got_pre[at] - value) / allowed;
        if (!(r_pre <= worst_pre)) worst_pre = r_pre;  // NaN counts as worst
        expected = math::gelu_tanh(value);
        allowed = out_rtol<S> * std::fabs(expected) + gelu_slope_bound * (sum_rtol * magnitude + out_rtol<S> * std::fabs(value)) +
                  gelu_tanh_rtol * std::fabs(value);
      }
      const double r = std::fabs(got_c[at] - expected) / allowed;
      if (!(r <= worst_c)) worst_c = r;  // NaN counts as worst
    }
  CHECK(worst_c <= 1.0);
  if (gelu) CHECK(worst_pre <= 1.0);
  // the padding columns, and all of pre without GELU, keep their contents
  bool padding_kept = true;
  for (i64 i = 0; i < g.m; ++i)
    for (i64 j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (j >= g.n && got_c[at] != padding) padding_kept = false;
      if ((j >= g.n || !gelu) && got_pre[at] != padding) padding_kept = false;
    }
  CHECK(padding_kept);
}

template <class S>
void check_all_gemms() {
  Buffer<unsigned char> workspace(workspace_bytes);
  cuda::Blas blas(workspace.get(), static_cast<i64>(workspace_bytes));
  std::uint32_t seed = 1;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      check_gemm<S>(blas, {ta, tb, 37, 24, 40}, seed++);
      check_gemm<S>(blas, {ta, tb, 37, 24, 40, -0.5f, 1.0f}, seed++);  // in place: C = -0.5 op(A) op(B) + C
      check_gemm<S>(blas, {ta, tb, 29, 13, 51, 1.0f, 1.0f, GemmEpilogue::none, 3, 5, 7}, seed++);
      check_gemm<S>(blas, {ta, tb, 1, 9, 5}, seed++);
      check_gemm<S>(blas, {ta, tb, 6, 1, 33}, seed++);
    }
  // bias epilogue, as a Linear's forward calls it (x W^T + b), and with alpha and beta
  check_gemm<S>(blas, {Trans::no, Trans::yes, 37, 24, 40, 1.0f, 0.0f, GemmEpilogue::bias}, seed++);
  check_gemm<S>(blas, {Trans::no, Trans::yes, 33, 17, 29, 0.75f, 1.0f, GemmEpilogue::bias, 2, 3, 4}, seed++);
  check_gemm<S>(blas, {Trans::yes, Trans::no, 21, 19, 12, 1.0f, 0.0f, GemmEpilogue::bias}, seed++);
  // bias + GELU keeping the pre-activation (its ld must be a multiple of 8);
  // alpha 0.5 and beta 1 pin the order: gelu(alpha AB + beta C + bias)
  check_gemm<S>(blas, {Trans::no, Trans::yes, 37, 24, 40, 1.0f, 0.0f, GemmEpilogue::gelu_aux_bias}, seed++);
  check_gemm<S>(blas, {Trans::no, Trans::yes, 19, 16, 53, 0.5f, 1.0f, GemmEpilogue::gelu_aux_bias, 3, 1, 16}, seed++);
  check_gemm<S>(blas, {Trans::yes, Trans::yes, 11, 8, 27, 1.0f, 0.0f, GemmEpilogue::gelu_aux_bias, 0, 0, 8}, seed++);
}

TEST_CASE("cuBLASLt through Blas::gemm: four transpose combinations, beta 0 and 1, bias, bias + GELU, padded ld", "[runtime]") {
  SECTION("float") { check_all_gemms<float>(); }
  SECTION("bf16") { check_all_gemms<bf16>(); }
}

// The bias and GELU's auxiliary output take part in cuBLASLt's choice of
// algorithm: a product met again with a less aligned bias or pre-activation
// is described again, its algorithm chosen with those pointers set.
template <class S>
void check_pointer_alignments() {
  Buffer<unsigned char> workspace(workspace_bytes);
  cuda::Blas blas(workspace.get(), static_cast<i64>(workspace_bytes));
  GemmCase g{Trans::no, Trans::yes, 37, 24, 40, 1.0f, 0.0f, GemmEpilogue::bias};
  check_gemm<S>(blas, g, 1);  // bias 64-byte aligned
  g.bias_offset = 16;
  check_gemm<S>(blas, g, 2);  // the same shapes, bias 16-byte aligned
  CHECK(blas.products() == 2);
  g.bias_offset = 0;
  check_gemm<S>(blas, g, 3);  // the first product again
  CHECK(blas.products() == 2);
  GemmCase gelu{Trans::no, Trans::yes, 19, 16, 53, 1.0f, 0.0f, GemmEpilogue::gelu_aux_bias};
  check_gemm<S>(blas, gelu, 4);
  gelu.pre_offset = 16;
  check_gemm<S>(blas, gelu, 5);
  gelu.bias_offset = 16;
  check_gemm<S>(blas, gelu, 6);
  CHECK(blas.products() == 5);
}

TEST_CASE("Blas::gemm: the bias and aux pointers' alignment is part of a product, set before its algorithm is chosen",
          "[runtime][blas]") {
  SECTION("float") { check_pointer_alignments<float>(); }
  SECTION("bf16") { check_pointer_alignments<bf16>(); }
}

#if !defined(__CUDACC__)

using cuda_emulator::runtime_stats;
using cuda_emulator::RuntimeStats;

bool all_bytes(const void* p, std::size_t n, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (bytes[i] != value) return false;
  return true;
}

TEST_CASE("runtime emulator: cudaMalloc and cudaHostAlloc are counted, 256-byte aligned, poisoned and freed", "[runtime]") {
  const RuntimeStats before = runtime_stats();
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, 1000) == cudaSuccess);
  CHECK(reinterpret_cast<std::uintptr_t>(d) % 256 == 0);
  CHECK(all_bytes(d, 1000, 0xFF));  // memory nothing wrote reads as NaN
  CHECK(runtime_stats().device_allocations == before.device_allocations + 1);
  CHECK(runtime_stats().device_bytes == before.device_bytes + 1000);

  void* h = nullptr;
  REQUIRE(cudaHostAlloc(&h, 300, cudaHostAllocDefault) == cudaSuccess);
  CHECK(reinterpret_cast<std::uintptr_t>(h) % 256 == 0);
  CHECK(runtime_stats().pinned_allocations == before.pinned_allocations + 1);
  CHECK(runtime_stats().pinned_bytes == before.pinned_bytes + 300);

  // the wrong free function, a pointer into a block, an unknown flag: errors, kept by cudaGetLastError
  CHECK(cudaFree(h) == cudaErrorInvalidValue);
  CHECK(cudaFreeHost(d) == cudaErrorInvalidValue);
  CHECK(cudaFree(static_cast<char*>(d) + 8) == cudaErrorInvalidValue);
  void* refused = nullptr;
  CHECK(cudaHostAlloc(&refused, 16, 0x100) == cudaErrorInvalidValue);
  CHECK(refused == nullptr);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // read and cleared
  CHECK(runtime_stats().pinned_allocations == before.pinned_allocations + 1);

  void* empty = d;
  CHECK(cudaMalloc(&empty, 0) == cudaSuccess);
  CHECK(empty == nullptr);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(runtime_stats().device_allocations == before.device_allocations + 1);

  REQUIRE(cudaFree(d) == cudaSuccess);
  REQUIRE(cudaFreeHost(h) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // twice
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(runtime_stats().device_bytes == before.device_bytes);
  CHECK(runtime_stats().pinned_bytes == before.pinned_bytes);
  CHECK(runtime_stats().device_allocations == before.device_allocations + 1);  // counts calls, not live blocks
}

TEST_CASE("runtime emulator: the arenas of runtime.cuh are one counted, zeroed allocation each", "[runtime]") {
  const RuntimeStats before = runtime_stats();
  {
    cuda::DeviceArena device(4096 + 3);
    cuda::PinnedArena pinned(512);
    CHECK(all_bytes(device.at<unsigned char>(0), 4096 + 3, 0));
    CHECK(runtime_stats().device_allocations == before.device_allocations + 1);
    CHECK(runtime_stats().pinned_allocations == before.pinned_allocations + 1);
    CHECK(runtime_stats().device_bytes == before.device_bytes + 4096 + 3);
    CHECK(runtime_stats().pinned_bytes == before.pinned_bytes + 512);
    cuda::DeviceArena nothing(0);
    CHECK(runtime_stats().device_allocations == before.device_allocations + 1);
  }
  CHECK(runtime_stats().device_bytes == before.device_bytes);
  CHECK(runtime_stats().pinned_bytes == before.pinned_bytes);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("runtime emulator: cudaMemcpy, cudaMemset and their async forms copy inside allocations only", "[runtime]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cuda::DeviceArena device(256);
  cuda::PinnedArena pinned(64);
  unsigned char* d = device.at<unsigned char>(0);
  unsigned char* p = pinned.at<unsigned char>(0);
  std::vector<unsigned char> host(64), back(64, 0);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<unsigned char>(3 * i + 1);

  REQUIRE(cudaMemcpy(d + 100, host.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // s is not ordered with the legacy stream's copy
  REQUIRE(cudaMemcpyAsync(d + 10, d + 100, 64, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d + 10, 0xAB, 4, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(p, d + 10, 64, cudaMemcpyDeviceToHost, s) == cudaSuccess);  // an offload
  REQUIRE(cudaMemcpy(back.data(), p, 64, cudaMemcpyHostToHost) == cudaSuccess);
  CHECK(all_bytes(back.data(), 4, 0xAB));
  CHECK(std::memcmp(back.data() + 4, host.data() + 4, 60) == 0);
  CHECK(all_bytes(d, 10, 0));
  REQUIRE(cudaMemset(p, 0x5A, 64) == cudaSuccess);  // pinned memory is device-accessible
  REQUIRE(cudaMemcpyAsync(d, p, 64, cudaMemcpyHostToDevice, s) == cudaSuccess);  // a prefetch
  CHECK(all_bytes(d, 64, 0x5A));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, d, 0, cudaMemcpyDeviceToDevice) == cudaSuccess);  // nothing to copy

  // out of the block, not device memory, overlapping, a bad kind or stream: errors, nothing written
  CHECK(cudaMemcpy(d + 200, host.data(), 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(back.data(), host.data() + 1, 8, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d + 8, d, 64, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 8, static_cast<cudaMemcpyKind>(9)) == cudaErrorInvalidMemcpyDirection);
  CHECK(cudaMemset(host.data(), 0, 8) == cudaErrorInvalidValue);
  CHECK(cudaMemset(d + 250, 0, 8) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(all_bytes(d, 64, 0x5A));
  CHECK(all_bytes(d + 200, 56, 0));
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaMemcpyAsync(d, host.data(), 8, cudaMemcpyHostToDevice, s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaSuccess);
}

// The legacy default stream and a non-blocking stream are not ordered: what
// cudaMemcpy from pageable memory and cudaMemset leave in flight lands only
// when something orders it (here: the emulator's deterministic choice of
// "as late as CUDA allows"), so a non-blocking stream reads the old bytes.
TEST_CASE("runtime emulator: the legacy stream's copies and memsets are not ordered with a non-blocking stream", "[runtime][legacy]") {
  cudaStream_t s = nullptr, blocking = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault) == cudaSuccess);
  cuda::DeviceArena device(256);  // zeroed before its constructor returns
  cuda::PinnedArena pinned(64);
  unsigned char* d = device.at<unsigned char>(0);
  std::vector<unsigned char> host(64, 7), back(64, 0);
  REQUIRE(all_bytes(d, 256, 0));

  REQUIRE(cudaMemcpy(d, host.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);  // pageable: staged, in flight
  host.assign(64, 9);                                                               // staged at the call
  REQUIRE(cudaMemcpyAsync(d + 64, d, 64, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);  // says nothing about the legacy stream
  CHECK(all_bytes(d, 64, 0));
  CHECK(all_bytes(d + 64, 64, 0));  // s read the bytes from before the copy
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(all_bytes(d, 64, 7));

  REQUIRE(cudaMemset(d, 1, 32) == cudaSuccess);  // asynchronous for device memory
  CHECK(all_bytes(d, 32, 7));
  REQUIRE(cudaMemcpyAsync(d + 128, d, 32, cudaMemcpyDeviceToDevice, blocking) == cudaSuccess);  // a blocking stream waits
  CHECK(all_bytes(d + 128, 32, 1));

  // an event recorded on the legacy stream orders the stream that waits for it
  REQUIRE(cudaMemcpy(d, host.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, nullptr) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  CHECK(all_bytes(d, 32, 1));  // not landed yet
  REQUIRE(cudaStreamWaitEvent(s, e, 0) == cudaSuccess);
  CHECK(all_bytes(d, 64, 9));
  CHECK(cudaEventQuery(e) == cudaSuccess);

  // a synchronous copy to the host, and a memset of pinned memory, wait for what came before
  REQUIRE(cudaMemset(d, 3, 64) == cudaSuccess);
  REQUIRE(cudaMemcpy(back.data(), d, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(all_bytes(back.data(), 64, 3));
  REQUIRE(cudaMemset(d, 4, 64) == cudaSuccess);
  REQUIRE(cudaMemset(pinned.at<unsigned char>(0), 5, 64) == cudaSuccess);
  CHECK(all_bytes(d, 64, 4));
  CHECK(all_bytes(pinned.at<unsigned char>(0), 64, 5));
  // cudaMemcpyAsync on the legacy stream waits like any other legacy work; cudaDeviceSynchronize ends it
  REQUIRE(cudaMemcpyAsync(d, pinned.at<unsigned char>(0), 64, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  CHECK(all_bytes(d, 64, 4));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(all_bytes(d, 64, 5));
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

// A host function is stream work: on a non-blocking stream it runs after the
// stream's earlier copies (it sees their bytes); on the legacy stream it
// waits in the queue until something orders it; a capture records it and
// every replay runs it; a null function is refused.
TEST_CASE("runtime emulator: cudaLaunchHostFunc runs in stream order", "[runtime]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cuda::DeviceArena device(64);
  cuda::PinnedArena pinned(64);
  unsigned char* d = device.at<unsigned char>(0);
  unsigned char* p = pinned.at<unsigned char>(0);
  struct Seen {
    const unsigned char* bytes;
    int calls = 0;
    unsigned char first = 0;
  } seen{p};
  const cudaHostFn_t look = [](void* data) {
    Seen& x = *static_cast<Seen*>(data);
    ++x.calls;
    x.first = x.bytes[0];
  };
  REQUIRE(cudaMemsetAsync(d, 0x21, 64, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(p, d, 64, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(s, look, &seen) == cudaSuccess);
  CHECK(seen.calls == 1);
  CHECK(seen.first == 0x21);

  REQUIRE(cudaLaunchHostFunc(nullptr, look, &seen) == cudaSuccess);  // the legacy stream: queued
  CHECK(seen.calls == 1);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  CHECK(seen.calls == 2);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d, 0x42, 64, s) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(p, d, 64, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaLaunchHostFunc(s, look, &seen) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  CHECK(seen.calls == 2);  // recorded, not run
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  CHECK(seen.calls == 4);
  CHECK(seen.first == 0x42);

  CHECK(cudaLaunchHostFunc(s, nullptr, &seen) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaLaunchHostFunc(s, look, &seen) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("runtime emulator: one device, streams and events are tokens that are checked, error names", "[runtime]") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  CHECK(devices == 1);
  CHECK(cuda::device_count() == 1);

  cudaStream_t compute = nullptr, copies = nullptr;
  cudaEvent_t ready = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&copies, cudaStreamDefault) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
  CHECK(compute != copies);
  CHECK(cudaEventRecord(ready, compute) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(copies, ready, 0) == cudaSuccess);
  CHECK(cudaEventRecord(ready, nullptr) == cudaSuccess);  // the default stream
  CHECK(cudaStreamSynchronize(copies) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);

  CHECK(cudaStreamCreateWithFlags(&compute, 0x10) == cudaErrorInvalidValue);
  CHECK(cudaStreamWaitEvent(copies, ready, 0x10) == cudaErrorInvalidValue);
  REQUIRE(cudaEventDestroy(ready) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(copies, ready, 0) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventRecord(ready, copies) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventDestroy(ready) == cudaErrorInvalidResourceHandle);
  REQUIRE(cudaStreamDestroy(copies) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
  CHECK(cudaStreamSynchronize(compute) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(nullptr) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);

  CHECK(std::string(cudaGetErrorName(cudaSuccess)) == "cudaSuccess");
  CHECK(std::string(cudaGetErrorName(cudaErrorNoDevice)) == "cudaErrorNoDevice");
  CHECK(std::string(cudaGetErrorString(cudaErrorMemoryAllocation)) == "out of memory");
  CHECK(std::string(cudaGetErrorName(cudaErrorIllegalAddress)) == "unrecognized error code");
  const cuda::cuda_error e(cudaErrorInvalidValue, "cudaMemcpy");
  CHECK(std::string(e.what()) == "headroom::cuda: cudaMemcpy: cudaErrorInvalidValue (invalid argument)");
}

// The raw cuBLASLt calls of Blas::find, for a column-major D (m, n) = op(A) op(B).
struct RawProduct {
  cublasLtHandle_t handle{};
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, d{};
  cublasLtMatmulPreference_t pref{};

  RawProduct(cudaDataType_t type, std::uint64_t m, std::uint64_t n, std::uint64_t a_rows, std::uint64_t a_cols, std::uint64_t b_rows,
             std::uint64_t b_cols) {
    REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&a, type, a_rows, a_cols, static_cast<std::int64_t>(a_rows)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b, type, b_rows, b_cols, static_cast<std::int64_t>(b_rows)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&d, type, m, n, static_cast<std::int64_t>(m)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  }
  ~RawProduct() {
    cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {a, b, d}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t& result, int& found) const {
    return cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref, 1, &result, &found);
  }
  template <class T>
  cublasStatus_t set(cublasLtMatmulDescAttributes_t attr, T value) {
    return cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value));
  }
};

TEST_CASE("runtime emulator: cuBLASLt validates shapes, attributes, epilogues and alignment", "[runtime]") {
  cublasLtMatmulHeuristicResult_t result{};
  int found = -1;
  SECTION("op(A) (m, k) and op(B) (k, n) must fit D (m, n)") {
    RawProduct fits(CUDA_R_32F, 5, 3, 5, 4, 4, 3);
    CHECK(fits.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
    CHECK(found == 1);
    RawProduct wrong_k(CUDA_R_32F, 5, 3, 5, 4, 6, 3);
    CHECK(wrong_k.heuristic(result, found) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(found == 0);
    RawProduct needs_transpose(CUDA_R_32F, 5, 3, 4, 5, 4, 3);
    CHECK(needs_transpose.heuristic(result, found) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(needs_transpose.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T) == CUBLAS_STATUS_SUCCESS);
    CHECK(needs_transpose.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t short_ld{};
    REQUIRE(cublasLtMatrixLayoutCreate(&short_ld, CUDA_R_32F, 5, 3, 4) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulAlgoGetHeuristic(fits.handle, fits.op, fits.a, fits.b, short_ld, short_ld, fits.pref, 1, &result, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(short_ld);
  }
  SECTION("unsupported types, epilogues and attributes") {
    RawProduct p(CUDA_R_16BF, 8, 8, 8, 8, 8, 8);
    cublasLtMatmulDesc_t desc{};
    CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_16F, CUDA_R_16F) == CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatrixLayout_t layout{};
    CHECK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_8I, 8, 8, 8) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(p.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_BIAS) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(p.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t{0}) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(p.set(CUBLASLT_MATMUL_DESC_TRANSA, std::int64_t{0}) == CUBLAS_STATUS_INVALID_VALUE);  // wrong size
    CHECK(p.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_8I) == CUBLAS_STATUS_NOT_SUPPORTED);
    // GELU's auxiliary output needs ld >= m and a multiple of 8
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{12}) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.heuristic(result, found) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{16}) == CUBLAS_STATUS_SUCCESS);
    CHECK(p.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
  }
  SECTION("a bias less aligned than the one set when the algorithm was chosen is refused") {
    RawProduct p(CUDA_R_32F, 4, 4, 4, 4, 4, 4);
    cuda::DeviceArena arena(4096);
    float* a = arena.at<float>(0);
    float* d = arena.at<float>(256);
    float* bias = arena.at<float>(512);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    for (int i = 0; i < 16; ++i) a[i] = 1.0f;
    for (int i = 0; i < 8; ++i) bias[i] = 0.5f;
    const std::uint32_t align = 4;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      REQUIRE(cublasLtMatmulPreferenceSetAttribute(p.pref, attr, &align, sizeof(align)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS) == CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    // chosen with no bias pointer set: cuBLASLt may assume its default (256-byte) alignment
    REQUIRE(p.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
    const void* shifted = bias + 1;
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, shifted) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a, p.a, a, p.b, &zero, d, p.d, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_INVALID_VALUE);
    // chosen with the 4-byte aligned bias set: it runs, and so does a better aligned bias
    REQUIRE(p.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a, p.a, a, p.b, &zero, d, p.d, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(d[0] == 4.5f);
    const void* aligned_bias = bias;
    REQUIRE(p.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, aligned_bias) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a, p.a, a, p.b, &zero, d, p.d, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_SUCCESS);
  }
  SECTION("pointers less aligned than the preference promised are refused; C == D needs one layout") {
    RawProduct p(CUDA_R_32F, 4, 4, 4, 4, 4, 4);
    const std::uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      REQUIRE(cublasLtMatmulPreferenceSetAttribute(p.pref, attr, &align, sizeof(align)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(p.heuristic(result, found) == CUBLAS_STATUS_SUCCESS);
    cuda::DeviceArena arena(4096);
    float* a = arena.at<float>(0);
    float* b = arena.at<float>(256);
    float* d = arena.at<float>(512);
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < 16; ++i) a[i] = b[i] = 1.0f;
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a, p.a, b, p.b, &zero, d, p.d, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(d[0] == 4.0f);
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a + 1, p.a, b, p.b, &zero, d, p.d, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayout_t wide{};
    REQUIRE(cublasLtMatrixLayoutCreate(&wide, CUDA_R_32F, 4, 4, 8) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmul(p.handle, p.op, &one, a, p.a, b, p.b, &one, d, wide, d, p.d, &result.algo, nullptr, 0, stream) ==
          CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatrixLayoutDestroy(wide);
  }
}

#endif  // !defined(__CUDACC__)

}  // namespace headroom::runtime_emulator_selftest
