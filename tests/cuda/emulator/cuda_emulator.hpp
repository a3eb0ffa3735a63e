#pragma once
// A CPU emulator for headroom's CUDA kernels (tests only). With it, g++
// compiles the kernel headers (cuda/device.cuh, cuda/kernels/*.cuh) and runs
// their kernels on the CPU, so every kernel is tested against the host engine
// where there is no GPU. Include it before any headroom CUDA header; it
// defines HEADROOM_CUDA_EMULATOR, which device.cuh requires outside nvcc.
//
// Execution model
//   - cuda::launch(kernel, grid, block, stream, args...) calls run(), which
//     runs the grid's blocks one after another (x fastest, then y, then z) on
//     the calling OS thread and returns when the last block has finished.
//   - A block's threads are fibers, one per thread, on stacks of 512 KiB
//     (allocated once, reused; a guard page below each: a deeper stack ends
//     in SIGSEGV). A fiber runs until it reaches a barrier or returns; then
//     the next ready fiber runs. On x86-64 a switch is a few instructions
//     (detail::switch_stacks below, about 40 ns); elsewhere, or with
//     -DHEADROOM_CUDA_EMULATOR_UCONTEXT (needed where CET shadow stacks are
//     enforced), it is swapcontext, which also sets the signal mask with a
//     system call (about 1 us here).
//   - The threads of a block start in ascending linear order in even blocks
//     and in descending order in odd ones, and every barrier releases its
//     waiters in reverse arrival order, so a missing barrier tends to show
//     whichever way the data flows between threads.
//   - Linear thread id = x + y bx + z bx by; a warp is 32 consecutive ids.
//   - __syncthreads() waits for every live thread of the block; threads that
//     returned no longer count (as on a GPU). __syncwarp() and the shuffles
//     wait for every live lane of the warp: masks are not honoured beyond
//     requiring the caller's own bit. A shuffle exchanges values through a
//     per-warp slot array at one warp barrier (two slot arrays, alternating).
//   - cuda/device.cuh's warp_sum and warp_max (the kernels' reductions) run
//     their five __shfl_xor_sync rounds as one warp collective: the lanes
//     leave their values at one barrier and read the rounds' results, the
//     same bits as the loop (Scheduler::xor_butterfly; its self-test), with
//     a fifth of the fiber switches.
//   - __shared__ is `static`: one copy per declaration, which is right because
//     blocks run one at a time. It is zero before the first launch and keeps
//     the previous block's contents (on a GPU it is undefined).
//   - wmma (m16n16k16 only): every lane holds the whole 16 x 16 tile, so
//     fragment element order differs from a GPU's; mma_sync sums the products
//     of the 16-bit inputs in f32 in k order. load/store_matrix_sync wait for
//     the warp first, as CUDA documents.
//   - Atomics are plain read-modify-writes (one OS thread). __expf and the
//     other fast-math intrinsics are the exact <cmath> functions.
//
// What it reports (std::logic_error from run(), naming the launch and block):
//   - barriers that can never complete: every live thread waits, but not all
//     at the same barrier (a barrier in divergent code);
//   - lanes of a warp meeting at different collectives (__syncwarp against a
//     shuffle, or shuffles of different kinds or sizes);
//   - a shuffle whose mask lacks the caller, or whose width is not a power of
//     two in [1, 32]; a barrier called outside a kernel; a launch from inside
//     a kernel.
//   A shuffle that reads a lane which did not take part (it returned, or the
//   block ends inside the warp) gets all bits set: NaN for floating types.
//   An exception thrown by a kernel aborts the launch and leaves run() as is.
//
// Launch configurations a GPU refuses are refused as CUDA refuses them: the
// launch does nothing and the error is left for cudaGetLastError /
// cudaPeekAtLastError (last_error()), with an H200's (sm_90) limits:
//   cudaErrorInvalidConfiguration  a zero grid or block dimension, more than
//                                  1024 threads per block, block.x or .y > 1024,
//                                  block.z > 64, grid.x > 2^31 - 1, grid.y or .z > 65535
//   cudaErrorInvalidValue          more dynamic shared memory than the kernel's
//                                  limit: 48 KiB, or what cudaFuncSetAttribute(
//                                  cudaFuncAttributeMaxDynamicSharedMemorySize)
//                                  raised it to (at most 227 KiB)
// The reason is kept in last_launch_refusal() for the emulator's own tests.
//
// Streams: run() is given the launch's stream and asks runtime_emulator.hpp
// (stream_hooks()) what to do with it: run it now, record it into the active
// stream capture, or refuse it; before a launch on the legacy stream or on a
// blocking stream, the legacy stream's deferred copies and memsets complete
// (runtime_emulator.hpp). Without runtime_emulator.hpp every launch runs now.
//
// What it does NOT check: races between blocks or within a block that its
// fiber order happens to satisfy, timing, memory coalescing, bank conflicts,
// real tensor-core numerics (rounding, accumulation order), static shared-memory
// size limits (nvcc's ptxas checks those), register pressure and __launch_bounds__, the accuracy of the
// fast-math intrinsics. Sanitizers (ASan) do not know about the fibers.
#define HEADROOM_CUDA_EMULATOR 1

#if defined(__CUDACC__)
#error "cuda_emulator.hpp is for g++ builds; nvcc compiles the kernels for a GPU"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>  // dim3, uint3, cudaStream_t (host-compilable)
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>  // with g++ (_GNU_SOURCE), also sincosf
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

// ---------------------------------------------------------------------------
// CUDA qualifiers under g++. crt/host_defines.h already makes __global__,
// __device__, __host__ and __shared__ empty and __forceinline__ an always-
// inline `inline`; __shared__ must become `static` (one copy per block).
// g++ 12 warns about `#pragma unroll` (-Wunknown-pragmas), and a
// `#pragma GCC diagnostic` here cannot silence it (GCC bug 53431, fixed in
// 13): build the emulated tests with -Wno-unknown-pragmas.
// ---------------------------------------------------------------------------
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

namespace headroom::cuda_emulator {

inline constexpr int max_block_threads = 1024;
inline constexpr int warp_lanes = 32;
inline constexpr std::size_t fiber_stack_bytes = std::size_t{512} << 10;

// An H200's (sm_90) launch limits (cudaDeviceProp: maxThreadsPerBlock,
// maxThreadsDim, maxGridSize, sharedMemPerBlock, sharedMemPerBlockOptin).
inline constexpr unsigned max_block_dim_xy = 1024, max_block_dim_z = 64;
inline constexpr unsigned max_grid_x = 2147483647u, max_grid_yz = 65535;
inline constexpr std::size_t default_dynamic_shared_bytes = std::size_t{48} << 10;
inline constexpr std::size_t max_dynamic_shared_bytes = std::size_t{227} << 10;

// The runtime's last error, which cudaGetLastError returns and clears and
// cudaPeekAtLastError returns (runtime_emulator.hpp); a refused launch sets it.
inline cudaError_t& last_error() noexcept {
  static cudaError_t error = cudaSuccess;
  return error;
}
// Why the last refused launch was refused (a sentence naming the limit).
inline std::string& last_launch_refusal() {
  static std::string why;
  return why;
}
// Per kernel (its address): the dynamic shared memory it may be launched
// with, when cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) set it.
inline std::map<const void*, std::size_t>& dynamic_shared_limits() {
  static std::map<const void*, std::size_t> limits;
  return limits;
}

// What runtime_emulator.hpp decides for a launch on a stream.
enum class LaunchRoute { run, record, refuse };
struct StreamHooks {
  LaunchRoute (*route)(cudaStream_t stream) = nullptr;  // refuse: it has set last_error()
  void (*record)(cudaStream_t stream, std::function<void()> launch) = nullptr;
};
inline StreamHooks& stream_hooks() noexcept {
  static StreamHooks hooks;
  return hooks;
}

namespace detail {

#if defined(__x86_64__) && defined(__ELF__) && !defined(HEADROOM_CUDA_EMULATOR_UCONTEXT)
// switch_stacks(save, load): pushes the callee-saved registers (System V:
// rbp, rbx, r12-r15, the MXCSR and x87 control words) on the running stack,
// stores the stack pointer in *save, and resumes the fiber whose stack
// pointer is load. Naked (no prologue); an inline function, so one copy per
// program. noipa: callers must assume the full System V clobbers, as the
// fiber they switch to runs arbitrary code (g++'s interprocedural register
// allocation would otherwise read the body; clang has no such pass by default).
#if defined(__clang__)
#define HEADROOM_CUDA_EMULATOR_NOIPA
#else
#define HEADROOM_CUDA_EMULATOR_NOIPA [[gnu::noipa]]
#endif
HEADROOM_CUDA_EMULATOR_NOIPA [[gnu::naked, gnu::noinline]] inline void switch_stacks(void** /*save*/, void* /*load*/) {
  asm(R"(
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
  )");
}
#undef HEADROOM_CUDA_EMULATOR_NOIPA

// A suspended fiber: its stack pointer (the registers are on its stack).
struct Context {
  void* sp = nullptr;

  // A fiber that will start in entry(), which must never return.
  void start(unsigned char* stack, std::size_t bytes, void (*entry)()) {
    auto* top = reinterpret_cast<std::uint64_t*>(reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t{15});
    std::uint32_t mxcsr;
    std::uint16_t fpcw;
    asm("stmxcsr %0" : "=m"(mxcsr));
    asm("fnstcw %0" : "=m"(fpcw));
    top[-1] = 0;                                       // entry's return address: none
    top[-2] = reinterpret_cast<std::uint64_t>(entry);  // where switch's `ret` goes
    for (int i = 3; i <= 8; ++i) top[-i] = 0;          // rbp, rbx, r12-r15
    top[-9] = mxcsr | std::uint64_t{fpcw} << 32;
    sp = top - 9;
  }
};
inline void switch_context(Context& from, const Context& to) { switch_stacks(&from.sp, to.sp); }
[[noreturn]] inline void jump_context(const Context& to) {
  void* abandoned;
  switch_stacks(&abandoned, to.sp);
  __builtin_unreachable();
}
#else
struct Context {
  ucontext_t uc;

  void start(unsigned char* stack, std::size_t bytes, void (*entry)()) {
    if (::getcontext(&uc) != 0) throw std::system_error(errno, std::generic_category(), "headroom::cuda_emulator: getcontext");
    uc.uc_stack.ss_sp = stack;
    uc.uc_stack.ss_size = bytes;
    uc.uc_link = nullptr;
    ::makecontext(&uc, entry, 0);
  }
};
inline void switch_context(Context& from, const Context& to) { ::swapcontext(&from.uc, &to.uc); }
[[noreturn]] inline void jump_context(const Context& to) {
  ::setcontext(&to.uc);
  std::terminate();  // setcontext returns only on failure
}
#endif

// What threadIdx, blockIdx, blockDim and gridDim read.
struct Builtins {
  uint3 thread_idx{};
  uint3 block_idx{};
  dim3 block_dim;
  dim3 grid_dim;
};
inline Builtins builtins;

// The warp collectives; the lanes of one warp barrier must all call the same
// one with the same value size.
enum class Collective : unsigned { syncwarp, shfl, shfl_up, shfl_down, shfl_xor, butterfly_sum, butterfly_max };
inline unsigned collective_key(Collective c, std::size_t value_bytes) {
  return static_cast<unsigned>(c) << 8 | static_cast<unsigned>(value_bytes);
}
inline const char* collective_name(unsigned key) {
  switch (static_cast<Collective>(key >> 8)) {
    case Collective::syncwarp:
      return "__syncwarp";
    case Collective::shfl:
      return "__shfl_sync";
    case Collective::shfl_up:
      return "__shfl_up_sync";
    case Collective::shfl_down:
      return "__shfl_down_sync";
    case Collective::shfl_xor:
      return "__shfl_xor_sync";
    case Collective::butterfly_sum:
      return "warp_sum (a __shfl_xor_sync butterfly)";
    case Collective::butterfly_max:
      return "warp_max (a __shfl_xor_sync butterfly)";
  }
  return "?";
}

struct Fiber {
  Context context;
  uint3 thread_idx;
  int id;  // linear thread id in the block
  int warp;
  int lane;
};

struct Warp {
  int live;          // lanes that exist and have not returned
  int arrived;       // lanes waiting at the current collective
  unsigned episode;  // completed collectives
  unsigned key;      // collective_key of the current one
  int waiting[warp_lanes];
  // Shuffle exchange: the slot array of episode e is slot[e & 1]. A lane can
  // write slot[e & 1] again at episode e + 2 only after every live lane has
  // arrived at e + 1, i.e. has read episode e's values.
  std::uint64_t slot[2][warp_lanes];
  unsigned stamp[2][warp_lanes];  // the episode that wrote the slot
  // A butterfly's results (xor_butterfly), computed by the first lane that
  // reads them after the barrier of episode butterfly_episode.
  float butterfly[warp_lanes];
  unsigned butterfly_episode;
};

class Scheduler {
 public:
  Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler() {
    if (stacks_ != nullptr) ::munmap(stacks_, stack_stride_ * max_block_threads);
  }

  static Scheduler& instance();
  std::uint64_t launches() const noexcept { return launches_.load(); }

  // Throws what run_grid would throw before running anything: a launch while another runs.
  void check_not_nested() const {
    if (active_) throw_nested_launch();
  }

  // Runs `invoke(bound)` as every thread of every block of the grid (a
  // configuration launch_refusal() accepts).
  void run_grid(dim3 grid, dim3 block, void (*invoke)(void*), void* bound) {
    if (active_.exchange(true)) throw_nested_launch();
    struct Deactivate {
      std::atomic<bool>& active;
      ~Deactivate() { active = false; }
    } deactivate{active_};
    allocate_stacks();
    ++launches_;
    grid_ = grid;
    block_ = block;
    invoke_ = invoke;
    bound_ = bound;
    builtins.grid_dim = grid;
    builtins.block_dim = block;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) run_block(uint3{x, y, z});
  }

  void syncthreads() {
    Fiber& self = running("__syncthreads()");
    block_waiting_[block_arrived_++] = self.id;
    if (block_arrived_ == block_live_) release_block();
    switch_from(self);
  }

  void syncwarp(unsigned mask) {
    Fiber& self = running("__syncwarp()");
    check_mask(self, mask, "__syncwarp");
    warp_barrier(self, collective_key(Collective::syncwarp, 0));
  }

  // The value of `value` in lane `b` (shfl), lane - b (up), lane + b (down) or
  // lane ^ b (xor) within the caller's segment of `width` lanes, with PTX's
  // range rules (shfl.sync): out of range gives the caller's own value.
  template <class T>
  T shuffle(Collective op, unsigned mask, T value, int b, int width) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(std::uint64_t),
                  "cuda_emulator: shuffles move trivially copyable values of at most 8 bytes");
    const unsigned key = collective_key(op, sizeof(T));
    Fiber& self = running(collective_name(key));
    check_mask(self, mask, collective_name(key));
    if (width < 1 || width > warp_lanes || (width & (width - 1)) != 0)
      throw std::logic_error(std::string("headroom::cuda_emulator: ") + collective_name(key) + " with width " +
                             std::to_string(width) + " (a power of two in [1, 32]) in " + where());
    Warp& warp = warps_[self.warp];
    const unsigned episode = leave_in_slot(self, key, value);
    const int buffer = episode & 1;

    const int lane = self.lane, first = lane & ~(width - 1), last = first + width - 1;
    int source = lane;
    bool in_range = true;
    switch (op) {
      case Collective::shfl:
        source = first | (b & (width - 1));
        break;
      case Collective::shfl_up:
        source = lane - (b & 31);
        in_range = source >= first;
        break;
      case Collective::shfl_down:
        source = lane + (b & 31);
        in_range = source <= last;
        break;
      case Collective::shfl_xor:
        source = lane ^ (b & 31);
        in_range = source <= last;
        break;
      case Collective::syncwarp:
      case Collective::butterfly_sum:
      case Collective::butterfly_max:
        break;
    }
    if (!in_range) return value;
    T result;
    if (warp.stamp[buffer][source] == episode) {
      std::memcpy(&result, &warp.slot[buffer][source], sizeof(T));
    } else {  // the source lane did not take part: undefined on a GPU
      std::memset(static_cast<void*>(&result), 0xff, sizeof(T));
    }
    return result;
  }

  // What `for (o = 16; o > 0; o /= 2) v = v OP __shfl_xor_sync(mask, v, o)`
  // gives each lane (OP: + for butterfly_sum; for butterfly_max, the shuffled
  // value where it is greater), at one warp barrier instead of five: the lanes
  // leave their values in the slots, and the first to read after the barrier
  // runs the five rounds over them in the loop's order, as every lane would
  // (a lane that did not take part reads as NaN, as in shuffle()). The same
  // bits as the shuffle loop; a fifth of the fiber switches.
  float xor_butterfly(Collective op, unsigned mask, float value) {
    const unsigned key = collective_key(op, sizeof(float));
    Fiber& self = running(collective_name(key));
    check_mask(self, mask, collective_name(key));
    Warp& warp = warps_[self.warp];
    const unsigned episode = leave_in_slot(self, key, value);
    const int buffer = episode & 1;
    if (warp.butterfly_episode != episode) {
      float v[warp_lanes];
      bool took_part[warp_lanes];
      for (int l = 0; l < warp_lanes; ++l) {
        took_part[l] = warp.stamp[buffer][l] == episode;
        std::memcpy(&v[l], &warp.slot[buffer][l], sizeof(float));
      }
      const float absent = std::bit_cast<float>(~0u);
      for (int o = warp_lanes / 2; o > 0; o /= 2) {
        float next[warp_lanes];
        for (int l = 0; l < warp_lanes; ++l) {
          const float w = took_part[l ^ o] ? v[l ^ o] : absent;
          next[l] = op == Collective::butterfly_sum ? v[l] + w : (w > v[l] ? w : v[l]);
        }
        std::memcpy(v, next, sizeof v);
      }
      std::memcpy(warp.butterfly, v, sizeof v);
      warp.butterfly_episode = episode;
    }
    return warp.butterfly[self.lane];
  }

 private:
  static void fiber_entry() {
    Scheduler& s = instance();
    try {
      s.invoke_(s.bound_);
    } catch (...) {
      s.error_ = std::current_exception();
    }
    s.exit_running();
  }

  [[noreturn]] static void throw_nested_launch() {
    throw std::logic_error(
        "headroom::cuda_emulator: a launch while another runs (a kernel cannot launch kernels; one launch at a time per "
        "process)");
  }

 public:
  // The error CUDA refuses the launch with (cudaSuccess: none), and why in `why`.
  static cudaError_t launch_refusal(const void* kernel, dim3 grid, dim3 block, std::size_t shared_bytes, std::string& why) {
    const unsigned long long threads = 1ull * block.x * block.y * block.z;
    why.clear();
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0)
      why = "a zero dimension";
    else if (block.x > max_block_dim_xy || block.y > max_block_dim_xy || block.z > max_block_dim_z)
      why = "block dimensions above (1024, 1024, 64)";
    else if (threads > static_cast<unsigned long long>(max_block_threads))
      why = "more than 1024 threads per block";
    else if (grid.x > max_grid_x || grid.y > max_grid_yz || grid.z > max_grid_yz)
      why = "grid dimensions above (2^31 - 1, 65535, 65535)";
    if (!why.empty()) {
      why = "grid " + dims(grid) + " x block " + dims(block) + ": " + why;
      return cudaErrorInvalidConfiguration;
    }
    const auto limit = dynamic_shared_limits().find(kernel);
    const std::size_t allowed = limit != dynamic_shared_limits().end() ? limit->second : default_dynamic_shared_bytes;
    if (shared_bytes > allowed) {
      why = std::to_string(shared_bytes) + " B of dynamic shared memory, above the kernel's " + std::to_string(allowed) +
            " B (48 KiB unless cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) raised it)";
      return cudaErrorInvalidValue;
    }
    return cudaSuccess;
  }

 private:
  void allocate_stacks() {
    if (stacks_ != nullptr) return;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t stride = fiber_stack_bytes + page;  // a guard page below each stack
    void* p =
        ::mmap(nullptr, stride * max_block_threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "headroom::cuda_emulator: fiber stacks");
    auto* base = static_cast<unsigned char*>(p);
    for (int t = 0; t < max_block_threads; ++t) {
      if (::mprotect(base + t * stride, page, PROT_NONE) != 0) {
        const int e = errno;
        ::munmap(p, stride * max_block_threads);
        throw std::system_error(e, std::generic_category(), "headroom::cuda_emulator: fiber stack guard");
      }
    }
    stacks_ = base;
    stack_stride_ = stride;
    guard_bytes_ = page;
  }

  void run_block(uint3 block_idx) {
    builtins.block_idx = block_idx;
    const int bx = static_cast<int>(block_.x), by = static_cast<int>(block_.y);
    const int threads = bx * by * static_cast<int>(block_.z);
    block_live_ = threads;
    block_arrived_ = 0;
    for (int w = 0; w * warp_lanes < threads; ++w) {
      Warp& warp = warps_[w];
      warp.live = threads - w * warp_lanes < warp_lanes ? threads - w * warp_lanes : warp_lanes;
      warp.arrived = 0;
      warp.episode = 0;
      std::memset(warp.stamp, 0xff, sizeof warp.stamp);
      warp.butterfly_episode = ~0u;
    }
    for (int t = 0; t < threads; ++t) {
      Fiber& f = fibers_[t];
      f.id = t;
      f.warp = t / warp_lanes;
      f.lane = t % warp_lanes;
      f.thread_idx =
          uint3{static_cast<unsigned>(t % bx), static_cast<unsigned>(t / bx % by), static_cast<unsigned>(t / (bx * by))};
      f.context.start(stacks_ + t * stack_stride_ + guard_bytes_, fiber_stack_bytes, &Scheduler::fiber_entry);
    }
    const unsigned linear_block = block_idx.x + grid_.x * (block_idx.y + grid_.y * block_idx.z);
    ready_head_ = ready_count_ = 0;
    for (int i = 0; i < threads; ++i) push_ready(linear_block % 2 == 0 ? i : threads - 1 - i);

    const int first = pop_ready();
    current_ = first;
    builtins.thread_idx = fibers_[first].thread_idx;
    in_kernel_ = true;
    switch_context(main_, fibers_[first].context);  // back when the block is done, stuck or failed
    in_kernel_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (block_live_ > 0) throw std::logic_error(deadlock_message());
  }

  Fiber& running(const char* what) {
    if (!in_kernel_) throw std::logic_error(std::string("headroom::cuda_emulator: ") + what + " called outside a kernel");
    return fibers_[current_];
  }

  void check_mask(const Fiber& self, unsigned mask, const char* what) const {
    if ((mask >> self.lane & 1u) == 0)
      throw std::logic_error(std::string("headroom::cuda_emulator: ") + what + " with a mask that lacks the calling lane " +
                             std::to_string(self.lane) + " in " + where());
  }

  // The running lane leaves `value` in its slot of the warp's current
  // episode and waits at the warp barrier of collective `key`; returns the
  // episode, whose slot array (episode & 1) the lanes then read.
  template <class T>
  unsigned leave_in_slot(Fiber& self, unsigned key, const T& value) {
    Warp& warp = warps_[self.warp];
    const unsigned episode = warp.episode;
    std::memcpy(&warp.slot[episode & 1][self.lane], &value, sizeof(T));
    warp.stamp[episode & 1][self.lane] = episode;
    warp_barrier(self, key);
    return episode;
  }

  void warp_barrier(Fiber& self, unsigned key) {
    Warp& warp = warps_[self.warp];
    if (warp.arrived == 0) {
      warp.key = key;
    } else if (warp.key != key) {
      throw std::logic_error(std::string("headroom::cuda_emulator: divergent warp collectives in ") + where() +
                             ": lanes of warp " + std::to_string(self.warp) + " meet at " + collective_name(warp.key) + " and " +
                             collective_name(key) + (key >> 8 == warp.key >> 8 ? " (of different value sizes)" : ""));
    }
    warp.waiting[warp.arrived++] = self.id;
    if (warp.arrived == warp.live) release_warp(warp);
    switch_from(self);
  }

  // The running fiber returned (or threw): it no longer counts at barriers.
  [[noreturn]] void exit_running() {
    Fiber& self = fibers_[current_];
    --block_live_;
    Warp& warp = warps_[self.warp];
    --warp.live;
    if (!error_) {
      if (block_arrived_ > 0 && block_arrived_ == block_live_) release_block();
      if (warp.arrived > 0 && warp.arrived == warp.live) release_warp(warp);
    }
    if (error_ || ready_count_ == 0) jump_context(main_);  // failed, done, or the rest is stuck
    const int next = pop_ready();
    current_ = next;
    builtins.thread_idx = fibers_[next].thread_idx;
    jump_context(fibers_[next].context);
  }

  // The running fiber waits; the next ready one runs (or the block ends).
  void switch_from(Fiber& self) {
    if (ready_count_ == 0) jump_context(main_);  // every live thread waits: deadlock
    const int next = pop_ready();
    if (next == self.id) return;
    current_ = next;
    builtins.thread_idx = fibers_[next].thread_idx;
    switch_context(self.context, fibers_[next].context);
  }

  void release_block() {
    for (int i = block_arrived_ - 1; i >= 0; --i) push_ready(block_waiting_[i]);
    block_arrived_ = 0;
  }

  void release_warp(Warp& warp) {
    ++warp.episode;
    for (int i = warp.arrived - 1; i >= 0; --i) push_ready(warp.waiting[i]);
    warp.arrived = 0;
  }

  void push_ready(int id) { ready_[(ready_head_ + ready_count_++) % max_block_threads] = id; }
  int pop_ready() {
    const int id = ready_[ready_head_];
    ready_head_ = (ready_head_ + 1) % max_block_threads;
    --ready_count_;
    return id;
  }

  static std::string dims(dim3 d) {
    // appended, not "(" + ...: g++ 12 -O3 warns falsely (-Wrestrict) about operator+(const char*, string&&)
    std::string s = "(";
    s += std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
    return s;
  }
  std::string where() const {
    const uint3 b = builtins.block_idx;
    return "block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) + ") of the launch grid " +
           dims(grid_) + " x block " + dims(block_);
  }

  std::string deadlock_message() const {
    std::ostringstream m;
    m << "headroom::cuda_emulator: barrier deadlock in " << where() << ": of " << block_live_ << " live threads, "
      << block_arrived_ << " wait at __syncthreads()";
    const int threads = static_cast<int>(block_.x * block_.y * block_.z);
    for (int w = 0; w * warp_lanes < threads; ++w)
      if (warps_[w].arrived > 0)
        m << ", " << warps_[w].arrived << " of warp " << w << "'s " << warps_[w].live << " live lanes at "
          << collective_name(warps_[w].key);
    m << " (a barrier in divergent code? warp collectives wait for every live lane of the warp)";
    return m.str();
  }

  Fiber fibers_[max_block_threads];
  Warp warps_[max_block_threads / warp_lanes];
  int block_waiting_[max_block_threads];
  int ready_[max_block_threads];
  int ready_head_ = 0, ready_count_ = 0;
  int block_live_ = 0, block_arrived_ = 0;
  int current_ = 0;
  bool in_kernel_ = false;
  Context main_;  // run_block's
  dim3 grid_, block_;
  void (*invoke_)(void*) = nullptr;
  void* bound_ = nullptr;
  std::exception_ptr error_;
  unsigned char* stacks_ = nullptr;
  std::size_t stack_stride_ = 0, guard_bytes_ = 0;
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> launches_{0};
};

inline Scheduler& Scheduler::instance() {
  static Scheduler s;
  return s;
}
inline Scheduler& scheduler() { return Scheduler::instance(); }

template <class Kernel, class Params>
struct BoundKernel {
  Kernel kernel;
  Params params;
  // Each thread gets its own copies of the parameters, as on a GPU.
  static void invoke(void* self) {
    auto& b = *static_cast<BoundKernel*>(self);
    std::apply(b.kernel, b.params);
  }
};

inline float to_f32(float x) { return x; }
inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float to_f32(__half x) { return __half2float(x); }
template <class T>
T from_f32(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half(x);
  else
    return static_cast<T>(x);
}

}  // namespace detail

// Runs kernel<<<grid, block, shared_bytes, stream>>>(args...) on the CPU and
// returns when it has finished. A configuration CUDA refuses does nothing and
// sets last_error() (see the top of this file); stream_hooks() may record the
// launch into a stream capture instead (the closure holds copies of the
// kernel, the shape and the arguments, and runs the kernel each time a graph
// replays it) or refuse it. Throws what the kernel threw, and
// std::logic_error for a kernel bug the emulator detects.
template <class... Params, class... Args>
void run(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "cuda_emulator::run: one argument per kernel parameter");
  using Bound = detail::BoundKernel<void (*)(Params...), std::tuple<Params...>>;
  const void* address = reinterpret_cast<const void*>(kernel);
  if (const cudaError_t e = detail::Scheduler::launch_refusal(address, grid, block, shared_bytes, last_launch_refusal());
      e != cudaSuccess) {
    last_error() = e;
    return;
  }
  detail::scheduler().check_not_nested();
  const StreamHooks hooks = stream_hooks();
  const LaunchRoute route = hooks.route != nullptr ? hooks.route(stream) : LaunchRoute::run;
  if (route == LaunchRoute::refuse) return;
  if (route == LaunchRoute::record) {
    hooks.record(stream, [kernel, grid, block, params = std::tuple<Params...>(std::forward<Args>(args)...)] {
      Bound bound{kernel, params};
      detail::scheduler().run_grid(grid, block, &Bound::invoke, &bound);
    });
    return;
  }
  Bound bound{kernel, std::tuple<Params...>(std::forward<Args>(args)...)};
  detail::scheduler().run_grid(grid, block, &Bound::invoke, &bound);
}

// Launches started so far in this process (for tests that count launches):
// direct ones and the kernels that graph launches replay; a launch recorded
// by a capture counts each time it is replayed, not when it is recorded.
inline std::uint64_t launch_count() noexcept { return detail::scheduler().launches(); }

}  // namespace headroom::cuda_emulator

// ---------------------------------------------------------------------------
// Built-in variables (read-only, as in CUDA).
// ---------------------------------------------------------------------------
inline const uint3& threadIdx = headroom::cuda_emulator::detail::builtins.thread_idx;
inline const uint3& blockIdx = headroom::cuda_emulator::detail::builtins.block_idx;
inline const dim3& blockDim = headroom::cuda_emulator::detail::builtins.block_dim;
inline const dim3& gridDim = headroom::cuda_emulator::detail::builtins.grid_dim;
inline constexpr int warpSize = headroom::cuda_emulator::warp_lanes;

// ---------------------------------------------------------------------------
// Barriers, shuffles, fences.
// ---------------------------------------------------------------------------
inline void __syncthreads() { headroom::cuda_emulator::detail::scheduler().syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { headroom::cuda_emulator::detail::scheduler().syncwarp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  using headroom::cuda_emulator::detail::Collective;
  return headroom::cuda_emulator::detail::scheduler().shuffle(Collective::shfl, mask, var, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using headroom::cuda_emulator::detail::Collective;
  return headroom::cuda_emulator::detail::scheduler().shuffle(Collective::shfl_up, mask, var, static_cast<int>(delta), width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using headroom::cuda_emulator::detail::Collective;
  return headroom::cuda_emulator::detail::scheduler().shuffle(Collective::shfl_down, mask, var, static_cast<int>(delta), width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  using headroom::cuda_emulator::detail::Collective;
  return headroom::cuda_emulator::detail::scheduler().shuffle(Collective::shfl_xor, mask, var, lane_mask, width);
}

namespace headroom::cuda_emulator {
// The xor butterfly over a warp's 32 lanes as one collective (Scheduler::
// xor_butterfly): what cuda/device.cuh's warp_sum and warp_max run here.
inline float warp_butterfly_sum(unsigned mask, float v) {
  return detail::scheduler().xor_butterfly(detail::Collective::butterfly_sum, mask, v);
}
inline float warp_butterfly_max(unsigned mask, float v) {
  return detail::scheduler().xor_butterfly(detail::Collective::butterfly_max, mask, v);
}
}  // namespace headroom::cuda_emulator

// One OS thread runs everything: memory is always coherent.
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __nanosleep(unsigned) {}
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Atomics: read-modify-write, returning the old value.
// ---------------------------------------------------------------------------
inline float atomicAdd(float* p, float v) { return std::exchange(*p, *p + v); }
inline double atomicAdd(double* p, double v) { return std::exchange(*p, *p + v); }
inline int atomicAdd(int* p, int v) {
  return std::exchange(*p, static_cast<int>(static_cast<unsigned>(*p) + static_cast<unsigned>(v)));
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::exchange(*p, *p + v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return std::exchange(*p, *p + v); }
// The f32 sum of two bf16 / f16 values is exact or far from a tie, so one
// rounding to the 16-bit type gives the correctly rounded sum, as the hardware.
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  return std::exchange(*p, __float2bfloat16(__bfloat162float(*p) + __bfloat162float(v)));
}
inline __half atomicAdd(__half* p, __half v) { return std::exchange(*p, __float2half(__half2float(*p) + __half2float(v))); }
inline int atomicMax(int* p, int v) { return std::exchange(*p, *p > v ? *p : v); }
inline unsigned atomicMax(unsigned* p, unsigned v) { return std::exchange(*p, *p > v ? *p : v); }
inline int atomicMin(int* p, int v) { return std::exchange(*p, *p < v ? *p : v); }
inline unsigned atomicMin(unsigned* p, unsigned v) { return std::exchange(*p, *p < v ? *p : v); }
inline int atomicExch(int* p, int v) { return std::exchange(*p, v); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return std::exchange(*p, v); }
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) { return std::exchange(*p, v); }
inline float atomicExch(float* p, float v) { return std::exchange(*p, v); }
inline int atomicCAS(int* p, int compare, int v) { return std::exchange(*p, *p == compare ? v : *p); }
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned v) { return std::exchange(*p, *p == compare ? v : *p); }
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare, unsigned long long v) {
  return std::exchange(*p, *p == compare ? v : *p);
}

// ---------------------------------------------------------------------------
// Math intrinsics. glibc's <math.h> declares __expf, __logf, ... (C linkage,
// noexcept) without exporting them; these definitions match those
// declarations. The fast-math ones are exact here.
// ---------------------------------------------------------------------------
extern "C" {
inline float __expf(float x) noexcept { return std::exp(x); }
inline float __exp10f(float x) noexcept { return std::pow(10.0f, x); }
inline float __logf(float x) noexcept { return std::log(x); }
inline float __log2f(float x) noexcept { return std::log2(x); }
inline float __log10f(float x) noexcept { return std::log10(x); }
inline float __sinf(float x) noexcept { return std::sin(x); }
inline float __cosf(float x) noexcept { return std::cos(x); }
inline float __tanf(float x) noexcept { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) noexcept {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float __powf(float x, float y) noexcept { return std::pow(x, y); }
inline float rsqrtf(float x) noexcept { return 1.0f / std::sqrt(x); }
}
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
template <class T>
T __ldg(const T* p) {
  return *p;
}

// ---------------------------------------------------------------------------
// nvcuda::wmma, m16n16k16. Every lane holds the whole tile, row-major in x[]
// (A: (M, K), B: (K, N), accumulator: (M, N)); kernels may only apply uniform
// element-wise operations to x[], as on a GPU.
// ---------------------------------------------------------------------------
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cuda_emulator: only m16n16k16 wmma fragments are emulated");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_void_v<Layout>
                                                 : std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "cuda_emulator: matrix_a / matrix_b fragments take row_major or col_major, accumulators no layout");

 public:
  using element_type = T;
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
};

// A or B tile from p with leading dimension ldm (in elements).
template <class Use, int M, int N, int K, class T, class Layout>
requires(!std::is_same_v<Use, accumulator>) void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p,
                                                                  unsigned ldm) {
  using F = fragment<Use, M, N, K, T, Layout>;
  __syncwarp();
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same_v<Layout, row_major> ? p[std::size_t{ldm} * r + c] : p[r + std::size_t{ldm} * c];
}

template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[std::size_t{ldm} * r + c] : p[r + std::size_t{ldm} * c];
}

template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[std::size_t{ldm} * r + c] : p[r + std::size_t{ldm} * c]) = f.x[r * N + c];
}

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const std::type_identity_t<T>& v) {
  for (T& e : f.x) e = v;
}

namespace detail {
// The last products mma_sync computed on this OS thread, by their inputs'
// bytes. Every lane holds the whole tiles here, so the 32 lanes of a warp
// multiply the same tiles one after another: the first lane computes, the
// others find its product (about 90 % of an emulated bf16 training step was
// these 32 copies of each product). A lane whose inputs differ computes its own.
template <int M, int N, int K, class TC, class TAB>
struct MmaMemo {
  struct Entry {
    TAB a[M * K];
    TAB b[K * N];
    TC c[M * N];
    TC d[M * N];
  };
  static constexpr int capacity = 8;  // a warp's accumulators between two of its barriers
  Entry entries[capacity];
  int size = 0;
  int next = 0;  // replaced next, round robin

  const Entry* find(const TAB* a, const TAB* b, const TC* c) const {
    for (int e = 0; e < size; ++e)
      if (std::memcmp(entries[e].a, a, sizeof(Entry::a)) == 0 && std::memcmp(entries[e].b, b, sizeof(Entry::b)) == 0 &&
          std::memcmp(entries[e].c, c, sizeof(Entry::c)) == 0)
        return &entries[e];
    return nullptr;
  }
  Entry& slot() {
    Entry& e = entries[next];
    next = (next + 1) % capacity;
    if (size < capacity) ++size;
    return e;
  }
};
}  // namespace detail

// d = a b + c, in f32: d(i, j) = c(i, j) + sum over k, in order, of a(i, k) b(k, j).
template <int M, int N, int K, class TC, class TAB, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TAB, LayoutA>& a,
              const fragment<matrix_b, M, N, K, TAB, LayoutB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  using headroom::cuda_emulator::detail::from_f32;
  using headroom::cuda_emulator::detail::to_f32;
  thread_local detail::MmaMemo<M, N, K, TC, TAB> memo;
  if (const auto* hit = memo.find(a.x, b.x, c.x)) {
    std::memcpy(d.x, hit->d, sizeof(d.x));
    return;
  }
  auto& entry = memo.slot();
  std::memcpy(entry.a, a.x, sizeof(entry.a));
  std::memcpy(entry.b, b.x, sizeof(entry.b));
  std::memcpy(entry.c, c.x, sizeof(entry.c));
  float fa[M * K], fb[K * N], sums[M * N];
  for (int e = 0; e < M * K; ++e) fa[e] = to_f32(a.x[e]);
  for (int e = 0; e < K * N; ++e) fb[e] = to_f32(b.x[e]);
  for (int e = 0; e < M * N; ++e) sums[e] = to_f32(c.x[e]);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k)  // k outermost per row: each sum still adds its products in k order
      for (int j = 0; j < N; ++j) sums[i * N + j] += fa[i * K + k] * fb[k * N + j];
  for (int e = 0; e < M * N; ++e) entry.d[e] = from_f32<TC>(sums[e]);
  std::memcpy(d.x, entry.d, sizeof(d.x));
}

}  // namespace nvcuda::wmma
