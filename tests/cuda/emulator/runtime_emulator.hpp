#pragma once
// The CUDA runtime and cuBLASLt for the CPU emulator (tests only): g++
// definitions of exactly the runtime and cuBLASLt functions that
// headroom/cuda/*.cuh and tests/cuda/support/kernel_test.hpp call, so that
// cuda::Blas and whole training steps of cuda::Trainer run on the CPU with no
// libcudart or libcublasLt linked (cuda_emulator.hpp runs the kernels).
//
// Linkage: every function is the extern "C" function that
// cuda_runtime_api.h / cublasLt.h declare, defined `inline` here, so every
// translation unit may include this header and the linker keeps one copy.
// Include it in every translation unit that includes the CUDA headers
// (kernel_test.hpp does, right after cuda_emulator.hpp); it is not
// thread-safe: call it from one thread, as the emulator's launches are.
//
// The runtime
//   - One device (cudaGetDeviceCount says 1). Device memory is host memory:
//     cudaMalloc and cudaHostAlloc return 256-byte aligned blocks filled with
//     0xFF bytes (NaN in f32, bf16 and f16), so a read of memory nothing wrote
//     shows up; runtime_stats() counts the allocations and the live bytes.
//   - Work on a non-blocking stream (cudaStreamNonBlocking) happens at the
//     call: kernels have run when cuda::launch returns, async copies and
//     memsets are done when they return. Streams and events are checked tokens.
//   - The legacy default stream (nullptr, cudaStreamLegacy) is NOT ordered
//     with non-blocking streams, as on a GPU, and the emulator makes that
//     race show: what CUDA lets return before the device has done it waits in
//     a queue of the legacy stream, in order, until something orders it with
//     the host or with the stream that needs it:
//       deferred  cudaMemcpy host-to-device from pageable memory (the source
//                 is copied at the call, as CUDA stages it) and device-to-
//                 device; cudaMemset of device memory; on the legacy stream,
//                 cudaMemcpyAsync (except device-to-pageable-host) and
//                 cudaMemsetAsync of device memory;
//       completes the queue  cudaDeviceSynchronize, cudaStreamSynchronize of the
//                 legacy stream, synchronous cudaMemcpy that returns after its
//                 copy (device-to-host, from pinned memory, host-to-host),
//                 cudaFree / cudaFreeHost, any work issued to the legacy stream
//                 or to a blocking stream (created without cudaStreamNonBlocking,
//                 cudaStreamPerThread), and cudaStreamWaitEvent /
//                 cudaEventSynchronize on an event recorded after the queued work.
//     So a kernel on a non-blocking stream launched right after cudaMemcpy of
//     its input from pageable memory reads the bytes from before the copy,
//     and the copy lands later, at the next point above.
//   - cudaLaunchHostFunc is stream work like a copy: the function runs at the
//     call on a non-blocking stream (on the calling thread, after the stream's
//     earlier work, which has run), waits in the legacy stream's queue on the
//     legacy stream, and is recorded by a capture (run at each replay).
//   - Stricter than CUDA, to catch engine bugs: the device side of a copy or
//     memset (the destination of HostToDevice, the source of DeviceToHost,
//     both of DeviceToDevice) must lie inside one live cudaMalloc or
//     cudaHostAlloc block (pinned memory is device-accessible, as under UVA);
//     overlapping copies, unknown streams, events and pointers to free are
//     errors. Failures set the error that cudaGetLastError returns and clears
//     (and cudaPeekAtLastError returns), as does a refused kernel launch
//     (cuda_emulator.hpp: cudaErrorInvalidConfiguration, or cudaErrorInvalidValue
//     for dynamic shared memory above the kernel's cudaFuncSetAttribute limit).
//
// Stream capture and graphs (cudaStreamBeginCapture ... cudaGraphLaunch)
//   - Between cudaStreamBeginCapture(s) and cudaStreamEndCapture(s), the
//     asynchronous operations issued to s, or to a stream that joined the
//     capture by waiting (cudaStreamWaitEvent) on an event recorded in a
//     capturing stream, are recorded instead of run: cudaMemcpyAsync,
//     cudaMemsetAsync, cudaLaunchHostFunc, cublasLtMatmul and kernel launches (cuda_emulator.hpp's
//     run() asks this header through stream_hooks()). Arguments are checked
//     when recorded.
//     cublasLtMatmul records alpha and beta by value (host pointer mode) and a
//     snapshot of the descriptor's attributes and the layouts.
//     cudaEventRecord and cudaStreamWaitEvent are ordering only: no operation,
//     but they give the dependencies (a fork and a join) that
//     cudaStreamEndCapture checks. An event recorded in a capture is a node of
//     that capture, not a recorded event: until it is recorded again outside
//     a capture, cudaStreamWaitEvent (from outside that capture),
//     cudaEventSynchronize and cudaEventQuery on it fail with
//     cudaErrorCapturedEvent, as CUDA's do; replaying the graph records nothing.
//   - Async operations on streams outside the capture run at once, as
//     before; on the legacy default stream (nullptr) they fail with
//     cudaErrorStreamCaptureImplicit when a capturing stream is blocking
//     (created without cudaStreamNonBlocking), as CUDA does.
//   - Refused during a capture with cudaErrorStreamCaptureUnsupported, which
//     invalidates it (cudaStreamCaptureModeGlobal's rules, whatever the mode):
//     cudaMemcpy, cudaMemset, cudaDeviceSynchronize, cudaStreamSynchronize
//     and cudaStreamDestroy of a capturing stream, cudaGraphLaunch into a
//     capturing stream, cudaMalloc, cudaFree, cudaHostAlloc and cudaFreeHost
//     (CUDA allows allocation in relaxed mode; headroom must not allocate in a
//     step), and, stricter than CUDA, a recorded copy whose host side is not
//     cudaHostAlloc memory (a graph reads its host buffers at every replay).
//     Operations on an invalidated capture fail with
//     cudaErrorStreamCaptureInvalidated and are dropped (a dropped kernel
//     launch sets the error cudaGetLastError returns).
//   - cudaStreamEndCapture ends the capture for all its streams. It returns
//     cudaErrorStreamCaptureInvalidated (and a null graph) after a refused
//     call, cudaErrorStreamCaptureUnjoined when some recorded operation is
//     not ordered before the origin stream's end (a fork not joined back),
//     otherwise a graph of the recorded operations in issue order.
//   - cudaGraphInstantiate (flags 0) copies the operations; cudaGraphLaunch
//     runs them in issue order at the call, reading memory then (a recorded
//     host-to-device copy reads its pinned source at each launch). A copy or
//     memset whose memory (device or pinned) was freed since fails at launch
//     with cudaErrorInvalidValue, ending it; kernels and matmuls are not
//     checked. A kernel's exception leaves cudaGraphLaunch.
//   - One capture at a time (a second, on another stream, is
//     cudaErrorNotSupported; cudaErrorIllegalState for a stream already
//     capturing); capture on the legacy stream is cudaErrorStreamCaptureUnsupported.
//   - runtime_stats() counts captured operations, graph launches and the
//     operations they replayed; cuda_emulator::launch_count() counts the
//     kernels that ran, replayed ones included (not recorded ones).
//
// cuBLASLt: cublasLtMatmul computes, column-major as cuBLASLt defines it,
//     D (m, n) = epilogue(alpha op(A) op(B) + beta C),   op(A): (m, k), op(B): (k, n)
//   with f32 alpha and beta (host pointers), compute type CUBLAS_COMPUTE_32F,
//   A and B both CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F and C = D of the same
//   type or CUDA_R_32F (16-bit inputs). Products are summed in double and D is
//   rounded to its type once; with beta = 0, C is not read; C == D (in place,
//   same layout) is allowed. Epilogues, following cublasLt.h and NVIDIA's
//   nvmath-python docs ("F(alpha a @ b + beta c), where F is the epilog"; the
//   bias is added "before applying final postprocessing"):
//     CUBLASLT_EPILOGUE_DEFAULT        D = alpha AB + beta C
//     CUBLASLT_EPILOGUE_BIAS           D = alpha AB + beta C + bias   (bias: (m), broadcast along columns)
//     CUBLASLT_EPILOGUE_GELU_AUX_BIAS  aux = alpha AB + beta C + bias (stored at EPILOGUE_AUX_LD in the aux type),
//                                      D = gelu_tanh(aux before its rounding) (math/activations.hpp)
//   with the bias and aux types defaulting to D's. Other epilogues, attributes,
//   operations and types return CUBLAS_STATUS_NOT_SUPPORTED where they are set.
//   cublasLtMatmulAlgoGetHeuristic checks that the layouts fit the operations
//   (ld >= rows; the aux ld >= m and a multiple of 8, as cuBLASLt requires)
//   and returns one algorithm (no workspace) that remembers the preference's
//   minimum alignments of A, B, C and D and the alignment of the bias and aux
//   pointers set in the descriptor when it was chosen (256 when not set): an
//   algorithm chosen for those pointers may rely on them. cublasLtMatmul checks
//   every pointer against what its algorithm remembers and returns
//   CUBLAS_STATUS_INVALID_VALUE for a misaligned or inconsistent call.
//   matmul_log() lists the shapes and leading dimensions of the calls.
#if defined(__CUDACC__)
#error "runtime_emulator.hpp is for g++ builds; nvcc links the real CUDA runtime and cuBLASLt"
#endif

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <headroom/math/activations.hpp>

#include "cuda_emulator.hpp"  // stream_hooks(): where a kernel launch goes

namespace headroom::cuda_emulator {

// What cudaMalloc / cudaHostAlloc did: successful calls and the bytes they
// hold now (as requested, before rounding up to 256); what stream capture
// recorded and graph launches replayed.
struct RuntimeStats {
  std::int64_t device_allocations = 0;   // cudaMalloc calls
  std::int64_t pinned_allocations = 0;   // cudaHostAlloc calls
  std::int64_t device_bytes = 0;         // live cudaMalloc bytes
  std::int64_t pinned_bytes = 0;         // live cudaHostAlloc bytes
  std::int64_t captured_operations = 0;  // kernel launches, copies, memsets, matmuls recorded by captures
  std::int64_t graph_launches = 0;       // cudaGraphLaunch calls that started their graph
  std::int64_t replayed_operations = 0;  // operations those launches ran
};
inline RuntimeStats& runtime_stats() {
  static RuntimeStats stats;
  return stats;
}

namespace runtime_detail {

inline constexpr std::size_t allocation_alignment = 256;
inline constexpr unsigned char uninitialized_byte = 0xFF;

// Live blocks, base address -> bytes requested.
using Blocks = std::map<std::uintptr_t, std::size_t>;
inline Blocks& device_blocks() {
  static Blocks blocks;
  return blocks;
}
inline Blocks& pinned_blocks() {
  static Blocks blocks;
  return blocks;
}

// The objects behind the opaque handles that this header hands out, each
// kind with its set of live ones.
struct Stream {
  unsigned flags = cudaStreamDefault;
  std::vector<std::uint64_t> behind;  // hung work its later work waits for (see hung_work())
};
struct Event {
  std::uint64_t capture = 0;          // the capture it was last recorded in (0: its last record was outside any)
  std::vector<std::size_t> after;     // the operations of that capture it follows
  std::uint64_t legacy_work = 0;      // the legacy stream's deferred work it follows (legacy().issued then)
  std::vector<std::uint64_t> behind;  // hung work it follows
};
template <class T>
std::set<const T*>& live() {
  static std::set<const T*> objects;
  return objects;
}
template <class T, class Handle>
T* find(Handle h) {
  T* p = reinterpret_cast<T*>(h);
  return live<T>().count(p) != 0 ? p : nullptr;
}
template <class T, class Handle>
void create(Handle* out, T value) {
  T* p = new T(std::move(value));
  live<T>().insert(p);
  *out = reinterpret_cast<Handle>(p);
}
template <class T, class Handle>
bool destroy(Handle h) {
  T* p = find<T>(h);
  if (p == nullptr) return false;
  live<T>().erase(p);
  delete p;
  return true;
}

inline cudaError_t& last_error() { return headroom::cuda_emulator::last_error(); }

// ---------------------------------------------------------------------------
// Hung work (nccl_emulator.hpp: a collective whose peers never came)
// ---------------------------------------------------------------------------
// Work that never completes until it is released (ncclCommAbort), each piece
// a number. A stream is behind the hung work issued to it and the hung work
// of the events it waited for; an event recorded on it is behind the same.
// The emulator has run the work issued after it already (work happens at
// the call), but what can be asked is answered as on a GPU: cudaStreamQuery
// and cudaEventQuery say cudaErrorNotReady, and cudaStreamSynchronize,
// cudaEventSynchronize and cudaDeviceSynchronize, which would never return,
// fail with cudaErrorLaunchTimeout instead.
inline std::set<std::uint64_t>& hung_work() {
  static std::set<std::uint64_t> hung;
  return hung;
}
inline bool blocked(const std::vector<std::uint64_t>& behind) {
  for (const std::uint64_t w : behind)
    if (hung_work().count(w) != 0) return true;
  return false;
}
inline std::vector<std::uint64_t> still_hung(const std::vector<std::uint64_t>& behind) {
  std::vector<std::uint64_t> h;
  for (const std::uint64_t w : behind)
    if (hung_work().count(w) != 0) h.push_back(w);
  return h;
}
// The stream a graph launch replays into (null outside cudaGraphLaunch):
// recorded operations that hang, hang there.
inline cudaStream_t& replay_stream() {
  static cudaStream_t s = nullptr;
  return s;
}
inline cudaError_t fail(cudaError_t e) {
  last_error() = e;
  return e;
}

inline bool inside(const Blocks& blocks, const void* p, std::size_t bytes) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  auto it = blocks.upper_bound(v);
  if (it == blocks.begin()) return false;
  --it;
  return v - it->first <= it->second && bytes <= it->second - (v - it->first);
}
// [p, p + bytes) lies inside one block a kernel or a copy engine may touch.
inline bool device_accessible(const void* p, std::size_t bytes) {
  return inside(device_blocks(), p, bytes) || inside(pinned_blocks(), p, bytes);
}

inline bool valid_stream(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || find<Stream>(s) != nullptr;
}

inline cudaError_t allocate(Blocks& blocks, void** out, std::size_t bytes, std::int64_t& calls, std::int64_t& live_bytes) {
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  *out = nullptr;
  if (bytes == 0) return cudaSuccess;
  const std::size_t rounded = (bytes + allocation_alignment - 1) / allocation_alignment * allocation_alignment;
  void* p = std::aligned_alloc(allocation_alignment, rounded);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, uninitialized_byte, rounded);
  blocks.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
  ++calls;
  live_bytes += static_cast<std::int64_t>(bytes);
  *out = p;
  return cudaSuccess;
}

inline cudaError_t release(Blocks& blocks, void* p, std::int64_t& live_bytes) {
  if (p == nullptr) return cudaSuccess;
  const auto it = blocks.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == blocks.end()) return fail(cudaErrorInvalidValue);
  live_bytes -= static_cast<std::int64_t>(it->second);
  blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

// The error a copy of `count` bytes would meet (a copy of none meets none).
inline cudaError_t check_copy(void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  bool dst_on_device = false, src_on_device = false;
  switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: break;
    case cudaMemcpyHostToDevice: dst_on_device = true; break;
    case cudaMemcpyDeviceToHost: src_on_device = true; break;
    case cudaMemcpyDeviceToDevice: dst_on_device = src_on_device = true; break;
    default: return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if ((dst_on_device && !device_accessible(dst, count)) || (src_on_device && !device_accessible(src, count)))
    return fail(cudaErrorInvalidValue);
  const auto d = reinterpret_cast<std::uintptr_t>(dst), s = reinterpret_cast<std::uintptr_t>(src);
  if (d < s + count && s < d + count) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

inline cudaError_t copy(void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess || count == 0) return e;
  std::memmove(dst, src, count);  // no overlap (checked above), but g++'s -Wrestrict cannot tell
  return cudaSuccess;
}

inline cudaError_t check_set(void* dst, std::size_t count) {
  return count == 0 || device_accessible(dst, count) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

inline cudaError_t set(void* dst, int value, std::size_t count) {
  if (const cudaError_t e = check_set(dst, count); e != cudaSuccess || count == 0) return e;
  std::memset(dst, value & 0xFF, count);
  return cudaSuccess;
}

// ---------------------------------------------------------------------------
// The legacy default stream's deferred work (see the top of this file)
// ---------------------------------------------------------------------------
struct LegacyWork {
  std::uint64_t number;
  std::function<cudaError_t()> run;
};
struct LegacyStream {
  std::vector<LegacyWork> pending;  // in issue order
  std::uint64_t issued = 0;         // work items ever deferred
};
inline LegacyStream& legacy() {
  static LegacyStream l;
  return l;
}
// Completes the deferred work numbered up to `upto`, in order.
inline void complete_legacy(std::uint64_t upto = ~std::uint64_t{0}) {
  LegacyStream& l = legacy();
  std::size_t done = 0;
  while (done < l.pending.size() && l.pending[done].number <= upto) {
    const std::function<cudaError_t()> run = std::move(l.pending[done].run);
    ++done;
    if (const cudaError_t e = run(); e != cudaSuccess) fail(e);
  }
  l.pending.erase(l.pending.begin(), l.pending.begin() + static_cast<std::ptrdiff_t>(done));
}
inline void defer_legacy(std::function<cudaError_t()> run) {
  LegacyStream& l = legacy();
  l.pending.push_back(LegacyWork{++l.issued, std::move(run)});
}
inline bool pinned(const void* p, std::size_t bytes) { return inside(pinned_blocks(), p, bytes); }

// ---------------------------------------------------------------------------
// Stream capture
// ---------------------------------------------------------------------------

// A recorded operation: run() does it and returns the error it met.
struct Operation {
  std::function<cudaError_t()> run;
  std::vector<std::size_t> after;  // the operations of its capture it follows (indices)
};
// cudaGraph_t and cudaGraphExec_t: the operations, in issue order.
struct Graph {
  std::vector<std::function<cudaError_t()>> operations;
};
struct GraphExec {
  std::vector<std::function<cudaError_t()>> operations;
};

// The active capture (id 0: none).
struct Capture {
  std::uint64_t id = 0;
  cudaStream_t origin = nullptr;
  bool invalidated = false;
  std::vector<Operation> operations;
  // The streams in the capture -> the operations their next operation follows.
  std::map<cudaStream_t, std::vector<std::size_t>> streams;
};
inline Capture& capture() {
  static Capture c;
  return c;
}

inline bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy; }
// Synchronizes with the legacy stream: every stream not created non-blocking.
inline bool is_blocking(cudaStream_t s) {
  const Stream* stream = find<Stream>(s);
  return stream == nullptr || (stream->flags & cudaStreamNonBlocking) == 0;
}

// A copy that runs now on `stream` (not captured; checked): on the legacy
// stream it is deferred as CUDA allows (`synchronous`: cudaMemcpy rather than
// cudaMemcpyAsync); work on a blocking stream first completes the legacy stream's.
inline cudaError_t issue_copy(void* dst, const void* src, std::size_t count, cudaMemcpyKind kind, cudaStream_t stream,
                              bool synchronous) {
  if (count == 0) return cudaSuccess;
  if (!is_legacy(stream)) {
    if (is_blocking(stream)) complete_legacy();
    return copy(dst, src, count, kind);
  }
  const bool from_host = kind == cudaMemcpyHostToDevice, device_to_device = kind == cudaMemcpyDeviceToDevice;
  if (from_host && !pinned(src, count)) {  // pageable: staged at the call, landing later
    if (synchronous) complete_legacy();    // "a stream sync is performed before the copy is initiated"
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    defer_legacy([dst, staged, count] {
      if (!device_accessible(dst, count)) return cudaErrorInvalidValue;
      std::memcpy(dst, staged->data(), count);
      return cudaSuccess;
    });
    return cudaSuccess;
  }
  if (device_to_device || (!synchronous && (from_host || (kind == cudaMemcpyDeviceToHost && pinned(dst, count))))) {
    defer_legacy([dst, src, count, kind] { return copy(dst, src, count, kind); });
    return cudaSuccess;
  }
  complete_legacy();  // returns once the copy is done
  return copy(dst, src, count, kind);
}
// A memset that runs now on `stream` (not captured; checked); of device memory on the legacy stream, deferred.
inline cudaError_t issue_set(void* dst, int value, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (!is_legacy(stream)) {
    if (is_blocking(stream)) complete_legacy();
    return set(dst, value, count);
  }
  if (pinned(dst, count)) {  // synchronous for pinned host memory
    complete_legacy();
    return set(dst, value, count);
  }
  defer_legacy([dst, value, count] { return set(dst, value, count); });
  return cudaSuccess;
}
inline bool capture_has_blocking_stream() {
  for (const auto& [stream, after] : capture().streams)
    if (is_blocking(stream)) return true;
  return false;
}

inline cudaError_t invalidate(cudaError_t e) {
  capture().invalidated = true;
  return fail(e);
}
// For the calls CUDA refuses while a capture is active (they synchronize or allocate).
inline cudaError_t refuse_in_capture() { return capture().id != 0 ? invalidate(cudaErrorStreamCaptureUnsupported) : cudaSuccess; }

// Where an asynchronous operation on `stream` goes: recorded (`record` set),
// run now, or refused with the error returned.
inline cudaError_t route(cudaStream_t stream, bool& record) {
  record = false;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  const Capture& c = capture();
  if (c.id == 0) return cudaSuccess;
  if (c.streams.count(stream) != 0) {
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    record = true;
    return cudaSuccess;
  }
  if (is_legacy(stream) && capture_has_blocking_stream()) return invalidate(cudaErrorStreamCaptureImplicit);
  return cudaSuccess;
}

// Appends an operation of `stream` (which is in the capture): it follows the
// stream's previous operation and what the stream waited for since.
inline void record(cudaStream_t stream, std::function<cudaError_t()> run) {
  Capture& c = capture();
  std::vector<std::size_t>& next_follows = c.streams[stream];
  c.operations.push_back(Operation{std::move(run), next_follows});
  next_follows.assign(1, c.operations.size() - 1);
  ++runtime_stats().captured_operations;
}

// cuda_emulator::stream_hooks(): where a kernel launch on `stream` goes.
inline headroom::cuda_emulator::LaunchRoute route_launch(cudaStream_t stream) {
  using headroom::cuda_emulator::LaunchRoute;
  bool record_it = false;
  if (route(stream, record_it) != cudaSuccess) return LaunchRoute::refuse;
  if (record_it) return LaunchRoute::record;
  if (is_legacy(stream) || is_blocking(stream)) complete_legacy();
  return LaunchRoute::run;
}
inline void record_launch(cudaStream_t stream, std::function<void()> launch) {
  record(stream, [launch = std::move(launch)] {
    launch();
    return cudaSuccess;
  });
}
inline const bool stream_hooks_installed = [] {
  headroom::cuda_emulator::stream_hooks() = {&route_launch, &record_launch};
  return true;
}();

// True when every recorded operation comes before the origin stream's end:
// every fork was joined back.
inline bool all_joined(const Capture& c) {
  std::vector<bool> reached(c.operations.size(), false);
  std::vector<std::size_t> pending = c.streams.at(c.origin);
  while (!pending.empty()) {
    const std::size_t i = pending.back();
    pending.pop_back();
    if (reached[i]) continue;
    reached[i] = true;
    pending.insert(pending.end(), c.operations[i].after.begin(), c.operations[i].after.end());
  }
  for (const bool r : reached)
    if (!r) return false;
  return true;
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* description;
};
// The errors this header returns, and those runtime.cuh names.
inline constexpr ErrorText error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid stream or event handle"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "the CUDA driver is older than the runtime"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "the CUDA driver is a stub library"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the emulator cannot wait for work that never completes (a hung collective)"},
};
inline const ErrorText* error_text(cudaError_t e) {
  for (const ErrorText& t : error_texts)
    if (t.code == e) return &t;
  return nullptr;
}

}  // namespace runtime_detail

namespace blaslt_detail {

struct Context {};
struct Layout {
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct MatmulDesc {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  std::int32_t bias_type = -1;  // -1: D's type
  void* aux = nullptr;
  std::int64_t aux_ld = 0;
  std::int32_t aux_type = -1;  // -1: D's type
};
struct Preference {
  std::uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D (cuBLASLt's defaults)
};

// cublasLtMatmulAlgo_t::data of the one algorithm: a tag, then the minimum
// alignments of A, B, C and D the preference promised, then the alignments of
// the bias and aux pointers the descriptor held when it was chosen.
inline constexpr std::uint64_t algo_tag = 0x68656164726f6f6dULL;  // "headroom"
inline constexpr int algo_bias_alignment = 5, algo_aux_alignment = 6;

// The largest power of two up to 256 that divides p (256 for null: an unset
// pointer promises cuBLASLt's default alignment).
inline std::uint64_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint64_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// Every cublasLtMatmul call that passed its checks, in cuBLASLt's
// column-major terms: D (m, n) = op(A) op(B), with the leading dimensions.
struct MatmulShape {
  std::int64_t m, n, k, lda, ldb, ldc, ldd;
};
inline std::vector<MatmulShape>& matmul_log() {
  static std::vector<MatmulShape> log;
  return log;
}

inline bool supported_type(std::int64_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }
inline std::size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

inline double load(cudaDataType_t t, const void* base, std::int64_t i) {
  switch (t) {
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}
inline void store(cudaDataType_t t, void* base, std::int64_t i, double v) {
  switch (t) {
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __double2bfloat16(v); break;
    case CUDA_R_16F: static_cast<__half*>(base)[i] = __double2half(v); break;
    default: static_cast<float*>(base)[i] = static_cast<float>(v); break;
  }
}

template <class T>
cublasStatus_t read_attribute(const void* buf, std::size_t bytes, T& out) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

inline bool has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

// A product whose descriptor and layouts agree, with its sizes.
struct Problem {
  std::int64_t m = 0, n = 0, k = 0;
  cudaDataType_t bias_type{}, aux_type{};
};

inline cublasStatus_t describe(const MatmulDesc& op, const Layout& a, const Layout& b, const Layout& c, const Layout& d, Problem& p) {
  const bool ta = op.trans_a == CUBLAS_OP_T, tb = op.trans_b == CUBLAS_OP_T;
  p.m = static_cast<std::int64_t>(d.rows);
  p.n = static_cast<std::int64_t>(d.cols);
  p.k = static_cast<std::int64_t>(ta ? a.rows : a.cols);
  const bool shapes = (ta ? a.cols : a.rows) == d.rows && (tb ? b.rows : b.cols) == d.cols &&
                      (tb ? b.cols : b.rows) == static_cast<std::uint64_t>(p.k) && c.rows == d.rows && c.cols == d.cols;
  auto ld_fits = [](const Layout& l) { return l.ld >= 1 && static_cast<std::uint64_t>(l.ld) >= l.rows; };
  if (!shapes || !ld_fits(a) || !ld_fits(b) || !ld_fits(c) || !ld_fits(d)) return CUBLAS_STATUS_INVALID_VALUE;
  if (a.type != b.type || c.type != d.type || (d.type != a.type && d.type != CUDA_R_32F)) return CUBLAS_STATUS_INVALID_VALUE;
  p.bias_type = op.bias_type < 0 ? d.type : static_cast<cudaDataType_t>(op.bias_type);
  p.aux_type = op.aux_type < 0 ? d.type : static_cast<cudaDataType_t>(op.aux_type);
  if (op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && (op.aux_ld < p.m || op.aux_ld % 8 != 0)) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

inline bool aligned(const void* p, std::uint64_t alignment) {
  return alignment == 0 || reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// One checked cublasLtMatmul call with everything it read on the host: the
// descriptor's attributes and the layouts as they were, alpha and beta by
// value. A capture records a copy, so the descriptor may change (Blas sets the
// bias and aux pointers before each call) without changing what was recorded.
struct Matmul {
  MatmulDesc op;
  Layout la, lb, lc, ld;
  Problem p;
  float alpha = 0, beta = 0;
  const void *A = nullptr, *B = nullptr, *C = nullptr;
  void* D = nullptr;

  void run() const {
    const std::int64_t m = p.m, n = p.n, k = p.k;
    const bool ta = op.trans_a == CUBLAS_OP_T, tb = op.trans_b == CUBLAS_OP_T;
    const bool read_c = beta != 0.0f, bias = has_bias(op.epilogue), gelu = op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    // op(A) row by row and op(B) column by column, as doubles: a_rows (m, k), b_cols (n, k)
    std::vector<double> a_rows(static_cast<std::size_t>(m * k)), b_cols(static_cast<std::size_t>(n * k));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t q = 0; q < k; ++q) a_rows[i * k + q] = load(la.type, A, ta ? q + i * la.ld : i + q * la.ld);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t q = 0; q < k; ++q) b_cols[j * k + q] = load(lb.type, B, tb ? j + q * lb.ld : q + j * lb.ld);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        double sum = 0;
        for (std::int64_t q = 0; q < k; ++q) sum += a_rows[i * k + q] * b_cols[j * k + q];
        double v = static_cast<double>(alpha) * sum;
        if (read_c) v += static_cast<double>(beta) * load(lc.type, C, i + j * lc.ld);
        if (bias) v += load(p.bias_type, op.bias, i);
        if (gelu) {
          store(p.aux_type, op.aux, i + j * op.aux_ld, v);
          v = headroom::math::gelu_tanh(v);
        }
        store(ld.type, D, i + j * ld.ld, v);
      }
  }
};

}  // namespace blaslt_detail
}  // namespace headroom::cuda_emulator

// ---------------------------------------------------------------------------
// The CUDA runtime
// ---------------------------------------------------------------------------
extern "C" {

inline cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaGetLastError(void) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const cudaError_t e = last_error();
  last_error() = cudaSuccess;
  return e;
}

inline cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return headroom::cuda_emulator::runtime_detail::last_error(); }

inline cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  using namespace headroom::cuda_emulator;
  if (func == nullptr) return runtime_detail::fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return runtime_detail::fail(cudaErrorNotSupported);  // not emulated
  if (value < 0 || static_cast<std::size_t>(value) > max_dynamic_shared_bytes) return runtime_detail::fail(cudaErrorInvalidValue);
  dynamic_shared_limits()[func] = static_cast<std::size_t>(value);
  return cudaSuccess;
}

inline const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const ErrorText* t = error_text(error);
  return t != nullptr ? t->name : "unrecognized error code";
}

inline const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const ErrorText* t = error_text(error);
  return t != nullptr ? t->description : "unrecognized error code";
}

inline cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  using namespace headroom::cuda_emulator;
  if (const cudaError_t e = runtime_detail::refuse_in_capture(); e != cudaSuccess) return e;
  RuntimeStats& s = runtime_stats();
  return runtime_detail::allocate(runtime_detail::device_blocks(), devPtr, size, s.device_allocations, s.device_bytes);
}

inline cudaError_t CUDARTAPI cudaFree(void* devPtr) {
  using namespace headroom::cuda_emulator;
  if (const cudaError_t e = runtime_detail::refuse_in_capture(); e != cudaSuccess) return e;
  runtime_detail::complete_legacy();  // cudaFree synchronizes the device
  return runtime_detail::release(runtime_detail::device_blocks(), devPtr, runtime_stats().device_bytes);
}

inline cudaError_t CUDARTAPI cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  using namespace headroom::cuda_emulator;
  if (const cudaError_t e = runtime_detail::refuse_in_capture(); e != cudaSuccess) return e;
  if ((flags & ~unsigned{cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined}) != 0)
    return runtime_detail::fail(cudaErrorInvalidValue);
  RuntimeStats& s = runtime_stats();
  return runtime_detail::allocate(runtime_detail::pinned_blocks(), pHost, size, s.pinned_allocations, s.pinned_bytes);
}

inline cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  using namespace headroom::cuda_emulator;
  if (const cudaError_t e = runtime_detail::refuse_in_capture(); e != cudaSuccess) return e;
  runtime_detail::complete_legacy();
  return runtime_detail::release(runtime_detail::pinned_blocks(), ptr, runtime_stats().pinned_bytes);
}

inline cudaError_t CUDARTAPI cudaMemset(void* devPtr, int value, size_t count) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (const cudaError_t e = refuse_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = check_set(devPtr, count); e != cudaSuccess) return e;
  return issue_set(devPtr, value, count, nullptr);
}

inline cudaError_t CUDARTAPI cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  bool record_it = false;
  if (const cudaError_t e = route(stream, record_it); e != cudaSuccess) return e;
  if (const cudaError_t e = check_set(devPtr, count); e != cudaSuccess) return e;
  if (!record_it) return issue_set(devPtr, value, count, stream);
  record(stream, [devPtr, value, count] { return set(devPtr, value, count); });
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (const cudaError_t e = refuse_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return e;
  return issue_copy(dst, src, count, kind, nullptr, true);
}

inline cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  bool record_it = false;
  if (const cudaError_t e = route(stream, record_it); e != cudaSuccess) return e;
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return e;
  if (!record_it) return issue_copy(dst, src, count, kind, stream, false);
  // both sides in live cudaMalloc / cudaHostAlloc blocks, now and at every replay
  auto allocated = [dst, src, count] { return count == 0 || (device_accessible(dst, count) && device_accessible(src, count)); };
  if (!allocated()) return invalidate(cudaErrorStreamCaptureUnsupported);  // pageable host memory
  record(stream, [dst, src, count, kind, allocated] { return allocated() ? copy(dst, src, count, kind) : fail(cudaErrorInvalidValue); });
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (const cudaError_t e = refuse_in_capture(); e != cudaSuccess) return e;
  for (const Stream* s : live<Stream>())
    if (blocked(s->behind)) return fail(cudaErrorLaunchTimeout);
  complete_legacy();
  return cudaSuccess;
}

// A host function is stream work: it runs when the stream's earlier work has
// (at the call on a non-blocking stream), waits in the legacy stream's queue
// there, and is recorded by a capture. It must call no CUDA function, as CUDA
// requires (the emulator does not check).
inline cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  using namespace headroom::cuda_emulator::runtime_detail;
  bool record_it = false;
  if (const cudaError_t e = route(stream, record_it); e != cudaSuccess) return e;
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  if (record_it) {
    record(stream, [fn, userData] {
      fn(userData);
      return cudaSuccess;
    });
  } else if (is_legacy(stream)) {
    defer_legacy([fn, userData] {
      fn(userData);
      return cudaSuccess;
    });
  } else {
    if (is_blocking(stream)) complete_legacy();
    fn(userData);
  }
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (pStream == nullptr || (flags & ~unsigned{cudaStreamNonBlocking}) != 0) return fail(cudaErrorInvalidValue);
  create(pStream, Stream{flags, {}});
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (find<Stream>(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (capture().streams.count(stream) != 0) return invalidate(cudaErrorStreamCaptureUnsupported);
  destroy<Stream>(stream);
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (capture().streams.count(stream) != 0) return invalidate(cudaErrorStreamCaptureUnsupported);
  bool capturing = false;
  if (const cudaError_t e = route(stream, capturing); e != cudaSuccess) return e;  // the legacy stream against a blocking capture
  if (const Stream* s = find<Stream>(stream); s != nullptr && blocked(s->behind)) return fail(cudaErrorLaunchTimeout);
  if (is_legacy(stream) || stream == cudaStreamPerThread) complete_legacy();
  return cudaSuccess;
}

// Whether the stream's work is done: not while it is behind hung work, or
// (the legacy stream) while deferred work waits; never completes anything.
inline cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (capture().streams.count(stream) != 0) return invalidate(cudaErrorStreamCaptureUnsupported);
  if (const Stream* s = find<Stream>(stream); s != nullptr && blocked(s->behind)) return cudaErrorNotReady;
  if ((is_legacy(stream) || is_blocking(stream)) && !legacy().pending.empty()) return cudaErrorNotReady;
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const Event* e = find<Event>(event);
  if (!valid_stream(stream) || e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if ((flags & ~unsigned{cudaEventWaitExternal}) != 0) return fail(cudaErrorInvalidValue);
  Capture& c = capture();
  const auto in_capture = c.streams.find(stream);
  if (e->capture != 0 && e->capture != c.id) return fail(cudaErrorCapturedEvent);  // last recorded in another (ended) capture
  if (c.id != 0 && e->capture == c.id) {  // a fork or a join: the stream is (now) in the capture
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (is_legacy(stream)) return invalidate(cudaErrorStreamCaptureImplicit);
    std::vector<std::size_t>& next_follows = c.streams[stream];
    next_follows.insert(next_follows.end(), e->after.begin(), e->after.end());
    return cudaSuccess;
  }
  if (in_capture != c.streams.end()) {  // a capturing stream waits for work outside the capture
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    return (flags & cudaEventWaitExternal) != 0 ? cudaSuccess : invalidate(cudaErrorStreamCaptureIsolation);
  }
  bool capturing = false;
  if (const cudaError_t error = route(stream, capturing); error != cudaSuccess) return error;
  complete_legacy(e->legacy_work);  // the stream's next work follows what the event follows
  if (Stream* s = find<Stream>(stream); s != nullptr) s->behind.insert(s->behind.end(), e->behind.begin(), e->behind.end());
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (event == nullptr || (flags & ~unsigned{cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess}) != 0)
    return fail(cudaErrorInvalidValue);
  create(event, Event{});
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::runtime_detail;
  Event* e = find<Event>(event);
  if (!valid_stream(stream) || e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  bool record_it = false;
  if (const cudaError_t error = route(stream, record_it); error != cudaSuccess) return error;
  e->capture = record_it ? capture().id : 0;
  e->after = record_it ? capture().streams[stream] : std::vector<std::size_t>{};
  e->legacy_work = !record_it && (is_legacy(stream) || is_blocking(stream)) ? legacy().issued : 0;
  const Stream* s = find<Stream>(stream);
  e->behind = !record_it && s != nullptr ? still_hung(s->behind) : std::vector<std::uint64_t>{};
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const Event* e = find<Event>(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (e->capture != 0) return fail(cudaErrorCapturedEvent);
  if (const cudaError_t error = refuse_in_capture(); error != cudaSuccess) return error;
  if (blocked(e->behind)) return fail(cudaErrorLaunchTimeout);
  complete_legacy(e->legacy_work);
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const Event* e = find<Event>(event);
  if (e == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (e->capture != 0) return fail(cudaErrorCapturedEvent);
  const LegacyStream& l = legacy();
  const bool pending = (!l.pending.empty() && l.pending.front().number <= e->legacy_work) || blocked(e->behind);
  return pending ? cudaErrorNotReady : cudaSuccess;  // not ready is no error: cudaGetLastError stays
}

inline cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  using namespace headroom::cuda_emulator::runtime_detail;
  return destroy<Event>(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

// ---------------------------------------------------------------------------
// Stream capture and graphs
// ---------------------------------------------------------------------------

inline cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal && mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  if (is_legacy(stream)) return fail(cudaErrorStreamCaptureUnsupported);
  Capture& c = capture();
  if (c.streams.count(stream) != 0) return fail(cudaErrorIllegalState);
  if (c.id != 0) return fail(cudaErrorNotSupported);  // the emulator has one capture at a time
  static std::uint64_t captures_begun = 0;
  c.id = ++captures_begun;
  c.origin = stream;
  c.streams[stream] = {};
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (pGraph == nullptr) return fail(cudaErrorInvalidValue);
  Capture& c = capture();
  if (c.streams.count(stream) == 0) return fail(cudaErrorIllegalState);
  if (stream != c.origin) return fail(cudaErrorStreamCaptureUnmatched);
  *pGraph = nullptr;
  const bool invalidated = c.invalidated, joined = all_joined(c);
  Graph graph;
  for (Operation& op : c.operations) graph.operations.push_back(std::move(op.run));
  c = Capture{};
  if (invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (!joined) return fail(cudaErrorStreamCaptureUnjoined);
  create(pGraph, std::move(graph));
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  using namespace headroom::cuda_emulator::runtime_detail;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (pCaptureStatus == nullptr) return fail(cudaErrorInvalidValue);
  const Capture& c = capture();
  *pCaptureStatus = cudaStreamCaptureStatusNone;
  if (c.streams.count(stream) != 0) {
    *pCaptureStatus = c.invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  } else if (c.id != 0 && is_legacy(stream) && capture_has_blocking_stream()) {
    return fail(cudaErrorStreamCaptureImplicit);  // CUDA does not invalidate the capture here
  }
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  using namespace headroom::cuda_emulator::runtime_detail;
  const Graph* g = find<Graph>(graph);
  if (pGraphExec == nullptr || g == nullptr || flags != 0) return fail(cudaErrorInvalidValue);  // no flags emulated
  create(pGraphExec, GraphExec{g->operations});
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  using namespace headroom::cuda_emulator;
  using namespace headroom::cuda_emulator::runtime_detail;
  const GraphExec* exec = find<GraphExec>(graphExec);
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  bool record_it = false;
  if (const cudaError_t e = route(stream, record_it); e != cudaSuccess) return e;
  if (record_it) return invalidate(cudaErrorStreamCaptureUnsupported);  // no child graphs
  if (is_legacy(stream) || is_blocking(stream)) complete_legacy();
  ++runtime_stats().graph_launches;
  struct Replay {  // restores replay_stream() however the replay ends
    cudaStream_t before = replay_stream();
    ~Replay() { replay_stream() = before; }
  } replay;
  replay_stream() = stream;
  for (const std::function<cudaError_t()>& run : exec->operations) {
    ++runtime_stats().replayed_operations;
    if (const cudaError_t e = run(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

inline cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  using namespace headroom::cuda_emulator::runtime_detail;
  return destroy<GraphExec>(graphExec) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

inline cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  using namespace headroom::cuda_emulator::runtime_detail;
  return destroy<Graph>(graph) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------
// cuBLASLt
// ---------------------------------------------------------------------------

inline cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  headroom::cuda_emulator::runtime_detail::create(lightHandle, Context{});
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  return headroom::cuda_emulator::runtime_detail::destroy<Context>(lightHandle) ? CUBLAS_STATUS_SUCCESS
                                                                                : CUBLAS_STATUS_NOT_INITIALIZED;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                                              uint64_t cols, int64_t ld) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  headroom::cuda_emulator::runtime_detail::create(matLayout, Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (matLayout == nullptr) return CUBLAS_STATUS_SUCCESS;
  return headroom::cuda_emulator::runtime_detail::destroy<Layout>(matLayout) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                                            cudaDataType_t scaleType) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  headroom::cuda_emulator::runtime_detail::create(matmulDesc, MatmulDesc{});
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (matmulDesc == nullptr) return CUBLAS_STATUS_SUCCESS;
  return headroom::cuda_emulator::runtime_detail::destroy<MatmulDesc>(matmulDesc) ? CUBLAS_STATUS_SUCCESS
                                                                                  : CUBLAS_STATUS_INVALID_VALUE;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                                                  const void* buf, size_t sizeInBytes) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  MatmulDesc* op = headroom::cuda_emulator::runtime_detail::find<MatmulDesc>(matmulDesc);
  if (op == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      std::int32_t v = 0;
      if (read_attribute(buf, sizeInBytes, v) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? op->trans_a : op->trans_b) = static_cast<cublasOperation_t>(v);
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      std::uint32_t v = 0;
      if (read_attribute(buf, sizeInBytes, v) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
      if (v != CUBLASLT_EPILOGUE_DEFAULT && v != CUBLASLT_EPILOGUE_BIAS && v != CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
      op->epilogue = static_cast<cublasLtEpilogue_t>(v);
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_attribute(buf, sizeInBytes, op->bias);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return read_attribute(buf, sizeInBytes, op->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return read_attribute(buf, sizeInBytes, op->aux_ld);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: {
      std::int32_t v = 0;
      if (read_attribute(buf, sizeInBytes, v) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
      if (v != -1 && !supported_type(v)) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE ? op->bias_type : op->aux_type) = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  headroom::cuda_emulator::runtime_detail::create(pref, Preference{});
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  return headroom::cuda_emulator::runtime_detail::destroy<Preference>(pref) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                        cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                                        size_t sizeInBytes) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  Preference* p = headroom::cuda_emulator::runtime_detail::find<Preference>(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: {  // the emulated algorithm needs none
      std::uint64_t bytes = 0;
      return read_attribute(buf, sizeInBytes, bytes);
    }
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return read_attribute(buf, sizeInBytes, p->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                                  cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                                  cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                                  cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                                  cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                                  int* returnAlgoCount) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  using headroom::cuda_emulator::runtime_detail::find;
  if (find<Context>(lightHandle) == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (returnAlgoCount == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *returnAlgoCount = 0;
  const MatmulDesc* op = find<MatmulDesc>(operationDesc);
  const Layout *a = find<Layout>(Adesc), *b = find<Layout>(Bdesc), *c = find<Layout>(Cdesc), *d = find<Layout>(Ddesc);
  const Preference* pref = find<Preference>(preference);
  if (op == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr || pref == nullptr || requestedAlgoCount <= 0 ||
      heuristicResultsArray == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  Problem problem;
  if (const cublasStatus_t s = describe(*op, *a, *b, *c, *d, problem); s != CUBLAS_STATUS_SUCCESS) return s;
  cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[0];
  r = cublasLtMatmulHeuristicResult_t{};
  r.algo.data[0] = algo_tag;
  for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = pref->min_alignment[i];
  r.algo.data[algo_bias_alignment] = has_bias(op->epilogue) ? alignment_of(op->bias) : 0;
  r.algo.data[algo_aux_alignment] = op->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? alignment_of(op->aux) : 0;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                                                  const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                                                  cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                                  cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                                  const cublasLtMatmulAlgo_t* algo, void* /*workspace: none needed*/,
                                                  size_t /*workspaceSizeInBytes*/, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::blaslt_detail;
  using headroom::cuda_emulator::runtime_detail::find;
  if (find<Context>(lightHandle) == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const MatmulDesc* op = find<MatmulDesc>(computeDesc);
  const Layout *la = find<Layout>(Adesc), *lb = find<Layout>(Bdesc), *lc = find<Layout>(Cdesc), *ld = find<Layout>(Ddesc);
  if (op == nullptr || la == nullptr || lb == nullptr || lc == nullptr || ld == nullptr || alpha == nullptr || beta == nullptr ||
      !headroom::cuda_emulator::runtime_detail::valid_stream(stream))
    return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  if (const cublasStatus_t s = describe(*op, *la, *lb, *lc, *ld, p); s != CUBLAS_STATUS_SUCCESS) return s;
  float alpha_value = 0, beta_value = 0;
  std::memcpy(&alpha_value, alpha, sizeof(float));
  std::memcpy(&beta_value, beta, sizeof(float));
  const bool read_c = beta_value != 0.0f;
  const bool bias = has_bias(op->epilogue), gelu = op->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  // pointers: present, naturally aligned, as aligned as the algorithm was promised
  const std::uint64_t* promised = algo != nullptr ? algo->data + 1 : nullptr;
  if (algo != nullptr && algo->data[0] != algo_tag) return CUBLAS_STATUS_INVALID_VALUE;
  auto usable = [&](const void* ptr, cudaDataType_t type, int which) {
    return ptr != nullptr && aligned(ptr, element_bytes(type)) && (promised == nullptr || aligned(ptr, promised[which]));
  };
  if (!usable(D, ld->type, 3) || (p.k > 0 && (!usable(A, la->type, 0) || !usable(B, lb->type, 1))) ||
      (read_c && !usable(C, lc->type, 2)) || (bias && !usable(op->bias, p.bias_type, algo_bias_alignment - 1)) ||
      (gelu && !usable(op->aux, p.aux_type, algo_aux_alignment - 1)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (C == D && lc->ld != ld->ld) return CUBLAS_STATUS_INVALID_VALUE;  // in place needs one layout

  const Matmul product{*op, *la, *lb, *lc, *ld, p, alpha_value, beta_value, A, B, C, D};
  bool record_it = false;
  if (headroom::cuda_emulator::runtime_detail::route(stream, record_it) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  matmul_log().push_back(MatmulShape{p.m, p.n, p.k, la->ld, lb->ld, lc->ld, ld->ld});
  if (!record_it) {
    using headroom::cuda_emulator::runtime_detail::is_blocking;
    using headroom::cuda_emulator::runtime_detail::is_legacy;
    if (is_legacy(stream) || is_blocking(stream)) headroom::cuda_emulator::runtime_detail::complete_legacy();
    product.run();
    return CUBLAS_STATUS_SUCCESS;
  }
  headroom::cuda_emulator::runtime_detail::record(stream, [product] {
    product.run();
    return cudaSuccess;
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
