// Tests of CUDA-graph stream capture as cuda::Trainer uses it (a whole step
// captured once, then replayed): a captured sequence of a pinned
// host-to-device copy, a kernel, a memset, Blas::gemm with the bias epilogue,
// a fork to a second stream (event, device-to-host copy there, event back)
// and a device-to-host copy into pinned memory must run nothing while it is
// captured and all of it, reading memory afresh, at each cudaGraphLaunch.
// Built by g++ they test the emulator's capture
// (tests/cuda/emulator/runtime_emulator.hpp); built by nvcc they check the
// same expectations on a GPU. Memory is cudaMalloc / cudaHostAlloc memory
// here (never cuda_test::Buffer, which is host memory under the emulator).
// The last tests (emulator only) check what the emulator refuses during a
// capture and how it reports it.
#include "../support/kernel_test.hpp"

#if !defined(__CUDACC__)
#include "../emulator/runtime_emulator.hpp"
#endif

#include <headroom/cuda/blas.cuh>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

// A named namespace: Catch2's TEST_CASE opens an anonymous one, and nvcc's
// generated stubs cannot name kernels in an anonymous namespace nested in another.
namespace headroom::graph_emulator_selftest {

using cuda::GemmEpilogue;
using cuda::Trans;

// x = 2 x + 1, element-wise; x: (n)
__global__ void double_plus_one(float* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

constexpr int threads = 16;
void launch_double_plus_one(float* x, int n, cudaStream_t stream) {
  cuda::launch(double_plus_one, "double_plus_one", dim3(static_cast<unsigned>(cuda::ceil_div(n, threads))), dim3(threads), stream, x, n);
}

// cudaMalloc (device) or cudaHostAlloc (pinned) memory for n values of T.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
    p_ = static_cast<T*>(p);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p_); }
  T* get() const { return p_; }
  void upload(const std::vector<T>& v) const {
    REQUIRE(v.size() == n_);
    REQUIRE(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // a pageable copy may still be in flight; the streams here are non-blocking
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    REQUIRE(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

template <class T>
class PinnedArray {
 public:
  explicit PinnedArray(std::size_t n) : n_(n) {
    void* p = nullptr;
    REQUIRE(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocDefault) == cudaSuccess);
    p_ = static_cast<T*>(p);
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { cudaFreeHost(p_); }
  T* get() const { return p_; }
  void fill(const std::vector<T>& v) const {
    REQUIRE(v.size() == n_);
    for (std::size_t i = 0; i < n_; ++i) p_[i] = v[i];
  }
  std::vector<T> values() const { return std::vector<T>(p_, p_ + n_); }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

struct Stream {
  cudaStream_t s{};
  Stream() { REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s); }
};

struct Event {
  cudaEvent_t e{};
  Event() { REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { cudaEventDestroy(e); }
};

// Ends a capture that a failed check left open (so that later tests do not
// run inside it) and clears the error it leaves. Declare it after the streams.
struct EndCaptureOnExit {
  cudaStream_t stream;
  ~EndCaptureOnExit() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    cudaGetLastError();
  }
};

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusInvalidated;
  REQUIRE(cudaStreamIsCapturing(s, &status) == cudaSuccess);
  return status;
}

// Small integers: every product and sum below is exact in f32 (and in TF32),
// so results compare exactly whatever the summation order.
std::vector<float> small_integers(std::size_t n, int seed, int amp) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * i + 3 * i + 11 * seed) % (2 * amp + 1)) - amp);
  return v;
}

// The step the graph holds, on the host: x = 2 in + 1 (m, k); c = x w + bias (m, n).
struct Expected {
  std::vector<float> x, c;
};
Expected reference(const std::vector<float>& in, const std::vector<float>& w, const std::vector<float>& bias, int m, int k, int n) {
  Expected e;
  for (float v : in) e.x.push_back(2.0f * v + 1.0f);
  e.c.assign(static_cast<std::size_t>(m * n), 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = bias[j];
      for (int q = 0; q < k; ++q) s += e.x[i * k + q] * w[q * n + j];
      e.c[i * n + j] = s;
    }
  return e;
}

TEST_CASE("stream capture: copies, a kernel, a memset, a GEMM and a fork/join run only when the graph is launched", "[graph]") {
  constexpr int m = 5, k = 6, n = 3;  // x: (m, k), w: (k, n), c: (m, n)
  constexpr std::size_t workspace_bytes = std::size_t{4} << 20;
  const float sentinel = -1000.0f;
  const std::vector<float> sentinel_x(m * k, sentinel), sentinel_c(m * n, sentinel);

  Stream compute, side;
  Event forked, joined;
  DeviceArray<float> x(m * k), w(k * n), bias(n), other_bias(n), c(m * n), other_c(m * n);
  DeviceArray<unsigned char> workspace(workspace_bytes);
  PinnedArray<float> staged_in(m * k), x_out(m * k), c_out(m * n);
  cuda::Blas blas(workspace.get(), static_cast<std::int64_t>(workspace_bytes));

  std::vector<float> weights = small_integers(k * n, 1, 2);
  const std::vector<float> bias_values = small_integers(n, 2, 3), other_bias_values{100.0f, 200.0f, 300.0f};
  w.upload(weights);
  bias.upload(bias_values);
  other_bias.upload(other_bias_values);
  x.upload(sentinel_x);
  c.upload(sentinel_c);
  REQUIRE(cudaMemset(other_c.get(), 0, m * n * sizeof(float)) == cudaSuccess);
  x_out.fill(sentinel_x);
  c_out.fill(sentinel_c);
  // the product Blas caches (one descriptor), first used outside the capture with the other bias
  auto gemm = [&](const float* b, float* out) {
    blas.gemm<float>(Trans::no, Trans::no, m, n, k, 1.0f, x.get(), k, w.get(), n, 1.0f, out, n, compute.s, GemmEpilogue::bias, b);
  };
  gemm(other_bias.get(), other_c.get());
  REQUIRE(cudaStreamSynchronize(compute.s) == cudaSuccess);

#if !defined(__CUDACC__)
  const cuda_emulator::RuntimeStats stats_before = cuda_emulator::runtime_stats();
  const std::uint64_t launches_before = cuda_emulator::launch_count();
#endif
  cudaGraph_t graph = nullptr;
  {
    EndCaptureOnExit end_capture{compute.s};
    REQUIRE(cudaStreamBeginCapture(compute.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(capture_status(compute.s) == cudaStreamCaptureStatusActive);
    CHECK(capture_status(side.s) == cudaStreamCaptureStatusNone);
    REQUIRE(cudaMemcpyAsync(x.get(), staged_in.get(), m * k * sizeof(float), cudaMemcpyHostToDevice, compute.s) == cudaSuccess);
    launch_double_plus_one(x.get(), m * k, compute.s);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    REQUIRE(cudaMemsetAsync(c.get(), 0, m * n * sizeof(float), compute.s) == cudaSuccess);
    gemm(bias.get(), c.get());  // beta = 1: c = x w + c + bias, so c must be zeroed at every launch
    // fork: the side stream copies x out while the compute stream goes on; join back
    REQUIRE(cudaEventRecord(forked.e, compute.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, forked.e, 0) == cudaSuccess);
    CHECK(capture_status(side.s) == cudaStreamCaptureStatusActive);
    REQUIRE(cudaMemcpyAsync(x_out.get(), x.get(), m * k * sizeof(float), cudaMemcpyDeviceToHost, side.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(joined.e, side.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(compute.s, joined.e, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(c_out.get(), c.get(), m * n * sizeof(float), cudaMemcpyDeviceToHost, compute.s) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(compute.s, &graph) == cudaSuccess);
  }
  REQUIRE(graph != nullptr);
  CHECK(capture_status(compute.s) == cudaStreamCaptureStatusNone);
  CHECK(capture_status(side.s) == cudaStreamCaptureStatusNone);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);  // the executable graph does not need it

  // nothing ran while captured
  CHECK(x.download() == sentinel_x);
  CHECK(c.download() == sentinel_c);
  CHECK(x_out.values() == sentinel_x);
  CHECK(c_out.values() == sentinel_c);
#if !defined(__CUDACC__)
  CHECK(cuda_emulator::launch_count() == launches_before);
  CHECK(cuda_emulator::runtime_stats().captured_operations == stats_before.captured_operations + 6);
  CHECK(cuda_emulator::runtime_stats().device_allocations == stats_before.device_allocations);
#endif

  // The cached descriptor now gets the other bias again: the graph keeps the
  // bias it was captured with.
  gemm(other_bias.get(), other_c.get());
  REQUIRE(cudaStreamSynchronize(compute.s) == cudaSuccess);

  for (int launch = 0; launch < 2; ++launch) {
    INFO("graph launch " << launch);
    const std::vector<float> in = small_integers(m * k, 5 + launch, 3);
    staged_in.fill(in);  // read by the recorded host-to-device copy at the launch
    if (launch == 1) {   // and device memory too
      weights = small_integers(k * n, 9, 2);
      w.upload(weights);
    }
    const Expected expected = reference(in, weights, bias_values, m, k, n);
#if !defined(__CUDACC__)
    const cuda_emulator::RuntimeStats before = cuda_emulator::runtime_stats();
    const std::uint64_t launches = cuda_emulator::launch_count();
#endif
    REQUIRE(cudaGraphLaunch(exec, compute.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute.s) == cudaSuccess);
    CHECK(x_out.values() == expected.x);
    CHECK(c_out.values() == expected.c);
#if !defined(__CUDACC__)
    CHECK(cuda_emulator::launch_count() == launches + 1);  // the replayed kernel
    CHECK(cuda_emulator::runtime_stats().graph_launches == before.graph_launches + 1);
    CHECK(cuda_emulator::runtime_stats().replayed_operations == before.replayed_operations + 6);
#endif
  }
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("stream capture: a synchronous cudaMemcpy during a capture fails and invalidates the capture", "[graph]") {
  constexpr int n = 40;
  Stream compute;
  DeviceArray<float> x(n);
  x.upload(std::vector<float>(n, 3.0f));
  std::vector<float> host(n, 0.0f);
  cudaGraph_t graph = nullptr;
  cudaError_t refused = cudaSuccess, ended = cudaSuccess;
  {
    EndCaptureOnExit end_capture{compute.s};
    REQUIRE(cudaStreamBeginCapture(compute.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    launch_double_plus_one(x.get(), n, compute.s);
    refused = cudaMemcpy(host.data(), x.get(), n * sizeof(float), cudaMemcpyDeviceToHost);
#if !defined(__CUDACC__)
    CHECK(capture_status(compute.s) == cudaStreamCaptureStatusInvalidated);
#endif
    ended = cudaStreamEndCapture(compute.s, &graph);
  }
  CHECK(refused != cudaSuccess);
  CHECK(host == std::vector<float>(n, 0.0f));  // the copy did not happen
  CHECK((ended == cudaSuccess) == (graph != nullptr));
#if !defined(__CUDACC__)
  // On a GPU only the failure is checked; the emulator answers as CUDA's
  // global-mode rules describe: refused, then the capture invalidated.
  CHECK(refused == cudaErrorStreamCaptureUnsupported);
  CHECK(ended == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
#endif
  if (graph != nullptr) cudaGraphDestroy(graph);
  CHECK(capture_status(compute.s) == cudaStreamCaptureStatusNone);
  cudaGetLastError();
  CHECK(x.download() == std::vector<float>(n, 3.0f));  // the captured kernel never ran
}

#if !defined(__CUDACC__)

using cuda_emulator::runtime_stats;

// Begins a capture on s, makes one refused call, and checks that the
// capture is then invalid: later operations fail, a kernel launch is dropped,
// the capture ends with cudaErrorStreamCaptureInvalidated and no graph.
template <class Call>
void check_refused(cudaStream_t s, float* x, Call call) {
  EndCaptureOnExit end_capture{s};
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  CHECK(call() == cudaErrorStreamCaptureUnsupported);
  CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
  CHECK(cudaMemsetAsync(x, 0, 4, s) == cudaErrorStreamCaptureInvalidated);
  const std::uint64_t launches = cuda_emulator::launch_count();
  const std::int64_t captured = runtime_stats().captured_operations;
  // a kernel launched into the invalidated capture is dropped; cuda::launch reports it
  CHECK_THROWS_WITH(launch_double_plus_one(x, 1, s), Catch::Contains("double_plus_one") &&
                                                         Catch::Contains("cudaErrorStreamCaptureInvalidated"));
  CHECK(cuda_emulator::launch_count() == launches);
  CHECK(runtime_stats().captured_operations == captured);
  CHECK(cudaGetLastError() == cudaSuccess);  // the launch check consumed it
  cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&end_capture);  // not null: the call must clear it
  CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  CHECK(capture_status(s) == cudaStreamCaptureStatusNone);
  cudaGetLastError();
}

TEST_CASE("graph emulator: allocation, synchronization and pageable copies are refused during a capture and invalidate it",
          "[graph]") {
  Stream s;
  DeviceArray<float> x(8);
  PinnedArray<float> pinned(8);
  std::vector<float> pageable(8, 1.0f);
  x.upload(std::vector<float>(8, 5.0f));
  const cuda_emulator::RuntimeStats before = runtime_stats();

  // a graph to launch into the capture
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s.s, &graph) == cudaSuccess);  // an empty graph
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  void* p = nullptr;
  SECTION("cudaMalloc") { check_refused(s.s, x.get(), [&] { return cudaMalloc(&p, 64); }); }
  SECTION("cudaHostAlloc") { check_refused(s.s, x.get(), [&] { return cudaHostAlloc(&p, 64, cudaHostAllocDefault); }); }
  SECTION("cudaFree") { check_refused(s.s, x.get(), [&] { return cudaFree(x.get()); }); }
  SECTION("cudaFreeHost") { check_refused(s.s, x.get(), [&] { return cudaFreeHost(pinned.get()); }); }
  SECTION("cudaMemset") { check_refused(s.s, x.get(), [&] { return cudaMemset(x.get(), 0, 32); }); }
  SECTION("cudaMemcpy") {
    check_refused(s.s, x.get(), [&] { return cudaMemcpy(x.get(), pinned.get(), 32, cudaMemcpyHostToDevice); });
  }
  SECTION("cudaDeviceSynchronize") { check_refused(s.s, x.get(), [&] { return cudaDeviceSynchronize(); }); }
  SECTION("cudaStreamSynchronize") { check_refused(s.s, x.get(), [&] { return cudaStreamSynchronize(s.s); }); }
  SECTION("cudaStreamDestroy") { check_refused(s.s, x.get(), [&] { return cudaStreamDestroy(s.s); }); }
  SECTION("cudaGraphLaunch") { check_refused(s.s, x.get(), [&] { return cudaGraphLaunch(exec, s.s); }); }
  SECTION("cudaMemcpyAsync from pageable memory") {
    check_refused(s.s, x.get(), [&] { return cudaMemcpyAsync(x.get(), pageable.data(), 32, cudaMemcpyHostToDevice, s.s); });
  }
  SECTION("cudaMemcpyAsync to pageable memory") {
    check_refused(s.s, x.get(), [&] { return cudaMemcpyAsync(pageable.data(), x.get(), 32, cudaMemcpyDeviceToHost, s.s); });
  }
  CHECK(p == nullptr);
  CHECK(runtime_stats().device_allocations == before.device_allocations);
  CHECK(runtime_stats().pinned_allocations == before.pinned_allocations);
  CHECK(runtime_stats().device_bytes == before.device_bytes);
  CHECK(runtime_stats().pinned_bytes == before.pinned_bytes);
  CHECK(x.download() == std::vector<float>(8, 5.0f));
  CHECK(pageable == std::vector<float>(8, 1.0f));
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
}

TEST_CASE("graph emulator: forks must be joined, waits on uncaptured work, streams outside the capture run at once", "[graph]") {
  Stream origin, other, outside;
  Event forked, earlier;
  DeviceArray<float> x(8), y(8);
  x.upload(std::vector<float>(8, 5.0f));
  y.upload(std::vector<float>(8, 5.0f));
  cudaGraph_t graph = nullptr;
  EndCaptureOnExit end_capture{origin.s};

  SECTION("a fork not joined back: cudaStreamEndCapture fails with cudaErrorStreamCaptureUnjoined") {
    REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(x.get(), 0, 8, origin.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(forked.e, origin.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(other.s, forked.e, 0) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(y.get(), 0, 8, other.s) == cudaSuccess);
    CHECK(cudaStreamEndCapture(other.s, &graph) == cudaErrorStreamCaptureUnmatched);  // not where it began
    CHECK(capture_status(other.s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(origin.s, &graph) == cudaErrorStreamCaptureUnjoined);
    CHECK(graph == nullptr);
    CHECK(capture_status(other.s) == cudaStreamCaptureStatusNone);
  }
  SECTION("a fork with nothing on it needs no join") {
    REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(x.get(), 0, 8, origin.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(forked.e, origin.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(other.s, forked.e, 0) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(origin.s, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
  SECTION("a capturing stream waiting on an event recorded outside the capture") {
    REQUIRE(cudaEventRecord(earlier.e, outside.s) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(origin.s, earlier.e, cudaEventWaitExternal) == cudaSuccess);
    CHECK(capture_status(origin.s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamWaitEvent(origin.s, earlier.e, 0) == cudaErrorStreamCaptureIsolation);
    CHECK(cudaStreamEndCapture(origin.s, &graph) == cudaErrorStreamCaptureInvalidated);
  }
  SECTION("work on a stream outside the capture runs at once; the legacy stream against a non-blocking capture too") {
    REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(x.get(), 0, 8, outside.s) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(y.get(), 0, 8, nullptr) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(origin.s, &graph) == cudaSuccess);
    const std::vector<float> got_x = x.download(), got_y = y.download();
    CHECK(got_x[0] == 0.0f);
    CHECK(got_x[1] == 0.0f);
    CHECK(got_x[2] == 5.0f);
    CHECK(got_y[1] == 0.0f);
    CHECK(got_y[2] == 5.0f);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  }
}

// An event recorded inside a capture is a node of that capture: waiting for
// it, synchronizing with it or querying it from outside the capture is
// cudaErrorCapturedEvent until it is recorded again outside a capture, and
// launching the graph does not record it.
TEST_CASE("graph emulator: an event last recorded in a capture cannot be waited for, synchronized or queried outside it",
          "[graph][event]") {
  Stream first, second;
  Event e;
  DeviceArray<float> x(8);
  x.upload(std::vector<float>(8, 1.0f));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaEventRecord(e.e, second.s) == cudaSuccess);  // recorded outside: fine to wait for
  REQUIRE(cudaStreamWaitEvent(first.s, e.e, 0) == cudaSuccess);
  {
    EndCaptureOnExit end{first.s};
    REQUIRE(cudaStreamBeginCapture(first.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    launch_double_plus_one(x.get(), 8, first.s);
    REQUIRE(cudaEventRecord(e.e, first.s) == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(first.s, &graph) == cudaSuccess);
  }
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, first.s) == cudaSuccess);
  CHECK(x.download() == std::vector<float>(8, 3.0f));
  CHECK(cudaStreamWaitEvent(second.s, e.e, 0) == cudaErrorCapturedEvent);
  CHECK(cudaEventSynchronize(e.e) == cudaErrorCapturedEvent);
  CHECK(cudaEventQuery(e.e) == cudaErrorCapturedEvent);
  CHECK(cudaGetLastError() == cudaErrorCapturedEvent);
  // recorded again outside a capture, it is an event again
  REQUIRE(cudaEventRecord(e.e, first.s) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(second.s, e.e, 0) == cudaSuccess);
  CHECK(cudaEventSynchronize(e.e) == cudaSuccess);
  CHECK(cudaEventQuery(e.e) == cudaSuccess);
  REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("graph emulator: one capture at a time, not on the legacy stream, graph handles are checked, replays check memory",
          "[graph]") {
  Stream first, second;
  cudaStream_t blocking{};
  REQUIRE(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault) == cudaSuccess);
  DeviceArray<float> x(8);
  x.upload(std::vector<float>(8, 5.0f));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  {
    EndCaptureOnExit end_first{first.s};
    CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamBeginCapture(first.s, static_cast<cudaStreamCaptureMode>(7)) == cudaErrorInvalidValue);
    REQUIRE(cudaStreamBeginCapture(first.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(first.s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
    CHECK(cudaStreamBeginCapture(second.s, cudaStreamCaptureModeGlobal) == cudaErrorNotSupported);
    CHECK(capture_status(first.s) == cudaStreamCaptureStatusActive);  // neither refusal invalidated it
    CHECK(cudaStreamEndCapture(second.s, &graph) == cudaErrorIllegalState);  // not capturing
    // a launch shape a GPU refuses is refused when the launch would be recorded (nothing is recorded)
    CHECK_THROWS_AS(cuda::launch(double_plus_one, "double_plus_one", dim3(1), dim3(2048), first.s, x.get(), 8), cuda::cuda_error);
    CHECK(capture_status(first.s) == cudaStreamCaptureStatusActive);
    REQUIRE(cudaMemcpyAsync(x.get() + 4, x.get(), 4 * sizeof(float), cudaMemcpyDeviceToDevice, first.s) == cudaSuccess);
    launch_double_plus_one(x.get(), 8, first.s);
    REQUIRE(cudaStreamEndCapture(first.s, &graph) == cudaSuccess);
  }
  CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUpload) == cudaErrorInvalidValue);  // no flags emulated
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, second.s) == cudaSuccess);  // any stream
  CHECK(x.download() == std::vector<float>(8, 11.0f));
  REQUIRE(cudaGraphLaunch(exec, nullptr) == cudaSuccess);  // x[4..8) = x[0..4), then 2 x + 1
  CHECK(x.download() == std::vector<float>(8, 23.0f));

  SECTION("a blocking stream's capture makes the legacy stream unusable (cudaErrorStreamCaptureImplicit)") {
    EndCaptureOnExit end_blocking{blocking};
    REQUIRE(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaStreamCaptureStatus status{};
    CHECK(cudaStreamIsCapturing(nullptr, &status) == cudaErrorStreamCaptureImplicit);
    CHECK(capture_status(blocking) == cudaStreamCaptureStatusActive);
    CHECK(cudaMemsetAsync(x.get(), 0, 4, nullptr) == cudaErrorStreamCaptureImplicit);
    CHECK(capture_status(blocking) == cudaStreamCaptureStatusInvalidated);
    cudaGraph_t refused = nullptr;
    CHECK(cudaStreamEndCapture(blocking, &refused) == cudaErrorStreamCaptureInvalidated);
    CHECK(x.download() == std::vector<float>(8, 23.0f));
  }
  SECTION("a replay whose memory was freed fails (a pinned staging buffer here)") {
    DeviceArray<float> y(8);
    void* gone = nullptr;
    REQUIRE(cudaHostAlloc(&gone, 32, cudaHostAllocDefault) == cudaSuccess);
    cudaGraph_t copy_graph = nullptr;
    cudaGraphExec_t copy_exec = nullptr;
    {
      EndCaptureOnExit end_first{first.s};
      REQUIRE(cudaStreamBeginCapture(first.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
      REQUIRE(cudaMemcpyAsync(y.get(), gone, 32, cudaMemcpyHostToDevice, first.s) == cudaSuccess);
      REQUIRE(cudaStreamEndCapture(first.s, &copy_graph) == cudaSuccess);
    }
    REQUIRE(cudaGraphInstantiate(&copy_exec, copy_graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(copy_exec, first.s) == cudaSuccess);
    REQUIRE(cudaFreeHost(gone) == cudaSuccess);
    CHECK(cudaGraphLaunch(copy_exec, first.s) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGraphExecDestroy(copy_exec) == cudaSuccess);
    CHECK(cudaGraphDestroy(copy_graph) == cudaSuccess);
  }
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(exec) == cudaErrorInvalidValue);
  CHECK(cudaGraphDestroy(graph) == cudaErrorInvalidValue);
  CHECK(cudaGraphLaunch(exec, first.s) == cudaErrorInvalidValue);
  CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaErrorInvalidValue);
  cudaGetLastError();
  CHECK(cudaStreamDestroy(blocking) == cudaSuccess);
}

#endif  // !defined(__CUDACC__)

}  // namespace headroom::graph_emulator_selftest
