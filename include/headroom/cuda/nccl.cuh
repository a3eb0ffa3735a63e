#pragma once
// cuda::NcclCommunicator: the CUDA engine's collectives and point-to-point
// transfers over NCCL, one GPU per rank (cuda/communicator.cuh says what
// every call does).
//
//   cudaSetDevice(local_rank);                            // one GPU per rank, chosen before anything else
//   host::MpiCommunicator mpi;                            // any host::Communicator joining the same processes
//   cuda::NcclCommunicator nccl(mpi);                     // rank 0 makes the ncclUniqueId, mpi broadcasts it
//   cuda::Trainer<Run> t(options, nccl);                  // Run has DataParallel<N>, OnCuda
//
// or, where the program moves the id itself:
//   ncclUniqueId id = rank == 0 ? cuda::NcclCommunicator::unique_id() : ...;  // then every rank receives rank 0's
//   cuda::NcclCommunicator nccl(id, rank, ranks);
//
// Link libnccl (and cudart). The communicator is made non-blocking
// (ncclConfig_t::blocking = 0): joining and every call return at once and
// are polled (ncclCommGetAsyncError), so nothing the host does can hang:
//   - joining (ncclCommInitRankConfig) must complete within the timeout
//     (a rank that never joins: "did not join within ...");
//   - synchronize(stream) polls cudaStreamQuery and ncclCommGetAsyncError.
//     An error NCCL reports (a peer's process died, a network error) or
//     work not finished within the timeout (a peer that hangs or stopped
//     calling) aborts the communicator (ncclCommAbort, which also makes its
//     kernels on the GPU return) and throws communication_error naming this
//     rank, the first collective that had not finished and its size;
//   - every later call throws "... refused: this communicator failed earlier (...)".
// The timeout (60 s unless given) is the longest one rank may wait for the
// slowest: above the longest compute between two waits.
//
// To name the collective a wait is stuck in, each call records an event
// after it on its stream (a ring of 1,024, created at construction); a call
// made while its stream is captured into a CUDA graph records none, and a
// replay that hangs is named "one of the N collectives of the captured
// graph (the first: ...)".
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "communicator.cuh"
#include "runtime.cuh"

namespace headroom::cuda {

namespace nccl_detail {
inline ncclDataType_t type_of(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::F64: return ncclFloat64;
    default: break;
  }
  throw std::invalid_argument("cuda::NcclCommunicator: a reduction of " + std::string(name_of(t)) +
                              " elements; the collectives reduce f32, bf16, f16 or f64");
}
inline std::string seconds(std::chrono::milliseconds t) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", static_cast<double>(t.count()) / 1000.0);
  return b;
}
// Waits with a growing pause (yield, then up to 1 ms): a poll loop that
// leaves the cores to the other ranks' processes.
struct Backoff {
  int round = 0;
  void pause() {
    if (++round < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(round < 256 ? 50 : 1000));
  }
};
}  // namespace nccl_detail

class NcclCommunicator final : public Communicator {
 public:
  using milliseconds = std::chrono::milliseconds;
  static constexpr milliseconds default_timeout{60000};
  static constexpr int tracked_calls = 1024;  // events naming the calls in flight

  // A new id for a job: rank 0 makes it; every rank constructs with it.
  static ncclUniqueId unique_id() {
    ncclUniqueId id{};
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw communication_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    return id;
  }

  // Joins the job of `size` ranks as `rank` (every rank passes rank 0's id).
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, milliseconds timeout = default_timeout)
      : rank_(rank), size_(size), timeout_(timeout) {
    if (size < 1 || rank < 0 || rank >= size)
      throw std::invalid_argument("cuda::NcclCommunicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                  " (a rank is 0 .. size - 1)");
    if (timeout.count() <= 0) throw std::invalid_argument("cuda::NcclCommunicator: the timeout must be positive");
    own_.create(size, tracked_calls);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw communication_error(who() + ": ncclCommInitRankConfig failed: " + ncclGetErrorString(r));
    }
    // a failure aborts the communicator; the constructor throws and Own frees the rest
    settle("joining the other ranks (ncclCommInitRankConfig)", "; a rank has not joined (did every rank start and pass rank 0's id?)");
  }

  // Joins the processes of `host` (its rank and size): rank 0 makes the id
  // and `host` broadcasts it (an all-gather of 128-byte blocks).
  explicit NcclCommunicator(host::Communicator& host, milliseconds timeout = default_timeout)
      : NcclCommunicator(broadcast_id(host), host.rank(), host.size(), timeout) {}

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    if (!failed_.empty()) {
      ncclCommAbort(comm_);
      return;
    }
    // a clean end: finish what is in flight (bounded), then free; else abort
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    nccl_detail::Backoff wait;
    while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      wait.pause();
      if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
    }
    if (r == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // ncclCommSplit (non-blocking, joined within the timeout, as construction is).
  std::unique_ptr<Communicator> split(int color, int key) override {
    refuse_if_failed("split");
    if (color < 0) throw std::invalid_argument(who() + ": split with a negative color (" + std::to_string(color) + ")");
    return std::unique_ptr<Communicator>(new NcclCommunicator(*this, color, key));
  }
  ncclComm_t handle() const { return comm_; }
  milliseconds timeout() const { return timeout_; }
  void set_timeout(milliseconds t) {
    if (t.count() <= 0) throw std::invalid_argument("cuda::NcclCommunicator: the timeout must be positive");
    timeout_ = t;
  }

  void all_reduce_sum(void* data, std::int64_t n, DType t, cudaStream_t stream) override {
    const ncclDataType_t type = checked_type("all_reduce_sum", n, t);
    issue(Call{"all_reduce_sum", n, 1, t, false}, stream, [&] {
      return ncclAllReduce(data, data, static_cast<std::size_t>(n), type, ncclSum, comm_, stream);
    });
  }
  void reduce_scatter_sum(const void* send, void* recv, std::int64_t n, DType t, cudaStream_t stream) override {
    const ncclDataType_t type = checked_type("reduce_scatter_sum", n, t);
    issue(Call{"reduce_scatter_sum", n, size_, t, false}, stream, [&] {
      return ncclReduceScatter(send, recv, static_cast<std::size_t>(n), type, ncclSum, comm_, stream);
    });
  }
  void all_gather(const void* send, void* recv, std::int64_t block_bytes, cudaStream_t stream) override {
    if (block_bytes < 0) throw std::invalid_argument(who() + ": all_gather of a negative size (" + std::to_string(block_bytes) + " bytes)");
    issue(Call{"all_gather", block_bytes, size_, DType::U8, true}, stream, [&] {
      return ncclAllGather(send, recv, static_cast<std::size_t>(block_bytes), ncclUint8, comm_, stream);
    });
  }

  // ncclSend and ncclRecv in one ncclGroupStart / ncclGroupEnd.
  void send_recv(const void* send, std::int64_t send_bytes, int to, void* recv, std::int64_t recv_bytes, int from,
                 cudaStream_t stream) override {
    const bool sends = to >= 0, receives = from >= 0;
    if ((sends && (send_bytes < 0 || to >= size_ || to == rank_)) || (receives && (recv_bytes < 0 || from >= size_ || from == rank_)))
      throw std::invalid_argument(who() + ": send_recv: send " + std::to_string(send_bytes) + " bytes to rank " + std::to_string(to) +
                                  ", receive " + std::to_string(recv_bytes) + " bytes from rank " + std::to_string(from) +
                                  " (peers are other ranks of the communicator, sizes not negative)");
    if (!sends && !receives) return;
    Call c{"send_recv", sends ? send_bytes : 0, 1, DType::U8, true};
    c.to = sends ? to : -1, c.from = receives ? from : -1, c.received = receives ? recv_bytes : 0;
    issue(c, stream, [&] {
      // (a non-blocking communicator may say ncclInProgress; issue() then waits for it to settle)
      auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
      const ncclResult_t start = ncclGroupStart();
      if (!ok(start)) return start;
      ncclResult_t r = sends ? ncclSend(send, static_cast<std::size_t>(send_bytes), ncclUint8, to, comm_, stream) : ncclSuccess;
      if (ok(r) && receives) r = ncclRecv(recv, static_cast<std::size_t>(recv_bytes), ncclUint8, from, comm_, stream);
      const ncclResult_t end = ncclGroupEnd();
      return !ok(r) ? r : end;
    });
  }

  void synchronize(cudaStream_t stream, std::string_view what) override {
    refuse_if_failed(what);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    nccl_detail::Backoff wait;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress)
        fail(pending(what) + " failed: NCCL reports " + ncclGetErrorString(async) + detail());
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaGetLastError();
        fail(pending(what) + " failed: cudaStreamQuery: " + cudaGetErrorName(q) + " (" + cudaGetErrorString(q) + ")");
      }
      if (std::chrono::steady_clock::now() >= deadline)
        fail(pending(what) + " did not complete within " + nccl_detail::seconds(timeout_) + "; another rank has stopped or hangs");
      wait.pause();
    }
    // the calls that have finished no longer name a later wait
    if (issued_ - retired_ > tracked_calls) retired_ = issued_ - tracked_calls;
    while (retired_ < issued_ && cudaEventQuery(own_.events[static_cast<std::size_t>(retired_ % tracked_calls)]) == cudaSuccess)
      ++retired_;
  }

 private:
  // The group of `parent`'s ranks of this color (NcclCommunicator::split).
  NcclCommunicator(NcclCommunicator& parent, int color, int key) : timeout_(parent.timeout_) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommSplit(parent.comm_, color, key, &comm_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      parent.fail(parent.who() + ": ncclCommSplit (color " + std::to_string(color) + ") failed: " + ncclGetErrorString(r) + parent.detail());
    }
    rank_ = parent.rank_, size_ = parent.size_;  // named as the parent until the group is known
    settle("splitting into groups (ncclCommSplit)", "; a rank has not split (did every rank call it?)");
    int n = 0, me = 0;
    if (ncclCommCount(comm_, &n) != ncclSuccess || ncclCommUserRank(comm_, &me) != ncclSuccess)
      fail(who() + ": ncclCommSplit gave a communicator whose rank or size NCCL does not tell");
    rank_ = me, size_ = n;
    own_.create(size_, tracked_calls);
  }

 protected:
  std::vector<std::uint64_t> gather_values(std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    all[static_cast<std::size_t>(rank_)] = value;
    std::uint64_t* mine = own_.values + rank_;
    check(cudaMemcpyAsync(mine, &value, sizeof value, cudaMemcpyHostToDevice, own_.stream), "upload a value to agree on");
    all_gather(mine, own_.values, sizeof value, own_.stream);
    check(cudaMemcpyAsync(all.data(), own_.values, all.size() * sizeof value, cudaMemcpyDeviceToHost, own_.stream),
          "download the values agreed on");
    synchronize(own_.stream, "agreeing on a value");
    return all;
  }

 private:
  struct Call {
    const char* name;
    std::int64_t n;
    int blocks;
    DType type;
    bool bytes;
    int to = -1, from = -1;         // send_recv: the peers (-1: none)
    std::int64_t received = 0;      // send_recv: the bytes received (n: sent)
    // "all_reduce_sum of 1024 f32", "reduce_scatter_sum of 2 x 512 bf16", "all_gather of 4 x 256 bytes",
    // "send of 6144 bytes to rank 1 with a receive of 6144 bytes from rank 1"
    std::string describe() const {
      if (to >= 0 || from >= 0) {
        const std::string in = "receive of " + std::to_string(received) + " bytes from rank " + std::to_string(from);
        if (to < 0) return in;
        const std::string out = "send of " + std::to_string(n) + " bytes to rank " + std::to_string(to);
        return from < 0 ? out : out + " with a " + in;
      }
      std::string s = std::string(name) + " of ";
      if (blocks > 1) s += std::to_string(blocks) + " x ";
      return s + std::to_string(n) + " " + std::string(bytes ? std::string_view("bytes") : name_of(type));
    }
  };

  // What this communicator allocates besides NCCL's own: a stream and a
  // device buffer for agree(), and the events of the calls' ring.
  struct Own {
    cudaStream_t stream = nullptr;
    std::uint64_t* values = nullptr;
    std::vector<cudaEvent_t> events;
    void create(int ranks, int calls) {
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (the communicator's)");
      check(cudaMalloc(reinterpret_cast<void**>(&values), static_cast<std::size_t>(ranks) * sizeof(std::uint64_t)),
            "cudaMalloc (the communicator's values)");
      events.resize(static_cast<std::size_t>(calls));
      for (cudaEvent_t& e : events) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
    Own() = default;
    Own(const Own&) = delete;
    Own& operator=(const Own&) = delete;
    ~Own() {
      for (cudaEvent_t e : events)
        if (e != nullptr) cudaEventDestroy(e);
      if (values != nullptr) cudaFree(values);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  };

  static ncclUniqueId broadcast_id(host::Communicator& host) {
    std::vector<char> blocks(sizeof(ncclUniqueId) * static_cast<std::size_t>(host.size()));
    if (host.rank() == 0) {
      const ncclUniqueId id = unique_id();
      std::memcpy(blocks.data(), &id, sizeof id);
    }
    host.all_gather(blocks.data(), sizeof(ncclUniqueId));
    ncclUniqueId id{};
    std::memcpy(&id, blocks.data(), sizeof id);
    return id;
  }

  ncclDataType_t checked_type(const char* call, std::int64_t n, DType t) const {
    if (n < 0) throw std::invalid_argument(who() + ": " + call + " of a negative count (" + std::to_string(n) + ")");
    return nccl_detail::type_of(t);
  }

  // Enqueues one call; records an event after it unless the stream is being
  // captured (then the call belongs to a graph and is listed with it).
  template <class Enqueue>
  void issue(const Call& c, cudaStream_t stream, Enqueue enqueue) {
    refuse_if_failed(c.describe());
    const ncclResult_t r = enqueue();
    if (r == ncclInProgress) settle(c.describe().c_str(), "");
    else if (r != ncclSuccess) fail(c.describe() + " failed: " + ncclGetErrorString(r) + detail());
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) {
      captured_.push_back(c);
      return;
    }
    const std::size_t slot = static_cast<std::size_t>(issued_ % tracked_calls);
    calls_[slot] = c;
    check(cudaEventRecord(own_.events[slot], stream), "cudaEventRecord (after a collective)");
    ++issued_;
  }

  // The first collective in flight that has not finished, or what the caller waits for.
  std::string pending(std::string_view what) {
    const std::uint64_t first = issued_ - retired_ > tracked_calls ? issued_ - tracked_calls : retired_;
    for (std::uint64_t i = first; i < issued_; ++i) {
      const std::size_t slot = static_cast<std::size_t>(i % tracked_calls);
      const cudaError_t q = cudaEventQuery(own_.events[slot]);
      if (q == cudaSuccess) continue;
      if (q != cudaErrorNotReady) cudaGetLastError();
      return who() + ": " + calls_[slot].describe();
    }
    if (!captured_.empty())
      return who() + ": one of the " + std::to_string(captured_.size()) + " collectives of the captured CUDA graph (the first: " +
             captured_.front().describe() + ")";
    return who() + ": " + std::string(what);
  }

  // Polls a non-blocking NCCL operation (ncclInProgress) until it settles, at most the timeout.
  void settle(const std::string& call, const char* hint) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    nccl_detail::Backoff wait;
    for (;;) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) fail(who() + ": " + call + " failed: " + ncclGetErrorString(async) + detail());
      if (std::chrono::steady_clock::now() >= deadline)
        fail(who() + ": " + call + " did not complete within " + nccl_detail::seconds(timeout_) + hint);
      wait.pause();
    }
  }

  // NCCL's own last message, when it has one.
  std::string detail() const {
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
    return last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string();
  }

  void refuse_if_failed(std::string_view call) const {
    if (!failed_.empty())
      throw communication_error(host::comm_detail::cat({who(), ": ", call, " refused: this communicator failed earlier (", failed_, ")"}));
  }

  // Aborts the communicator (its kernels return) and throws; every later call is refused.
  [[noreturn]] void fail(const std::string& sentence) {
    failed_ = sentence;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw communication_error(sentence);
  }

  int rank_ = 0, size_ = 1;
  milliseconds timeout_;
  Own own_;
  ncclComm_t comm_ = nullptr;
  std::string failed_;
  std::vector<Call> calls_ = std::vector<Call>(tracked_calls, Call{"", 0, 1, DType::U8, true});
  std::uint64_t issued_ = 0, retired_ = 0;  // calls [retired_, issued_) may be in flight
  std::vector<Call> captured_;               // calls recorded into a CUDA graph
};

}  // namespace headroom::cuda
