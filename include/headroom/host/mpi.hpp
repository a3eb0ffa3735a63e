#pragma once
// MpiCommunicator: the host engine's Communicator over MPI, for distributed
// runs (include it only there: it includes <mpi.h>; link MPI::MPI_CXX, or
// build with mpicxx). Launch with mpirun / srun; see docs/distributed.md.
//
//   host::MpiCommunicator comm;                       // MPI_Init_thread if needed, MPI_Comm_dup(MPI_COMM_WORLD)
//   comm.check_size(2, "data-parallel ranks");        // every rank throws if -np is not 2
//   comm.agree(plan_hash);                            // every rank throws unless all hashes are equal
//   comm.all_reduce_sum(grads, n, DType::F32);
//
// How a call completes. Every call is issued non-blocking (MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Isend / MPI_Irecv,
// MPI_Ibarrier, MPI_Ibcast / MPI_Ireduce for very large blocks) and polled
// with MPI_Test until a deadline (a tight loop for 1 ms, then a 50 us sleep
// between tests: set_polling). Each MPI operation (a call, or
// one chunk of a call larger than the chunk limit) must complete within the
// timeout, else communication_error:
//   "rank 0 of 2: all_reduce_sum of 4096 f32 did not complete within 60 s;
//    another rank has stopped or hangs"
// MPI error codes (the communicator uses MPI_ERRORS_RETURN) become
// communication_error with MPI_Error_string's text. After either, this
// communicator refuses every call (throws at once), and its destructor
// neither frees it nor finalizes MPI (both would wait for the missing rank):
// end the process, and the launcher stops the others.
//
// A rank that dies. OpenMPI's mpirun (4.1.4) answers a rank's death by
// sending every other rank SIGCONT, SIGTERM 1 s later
// (odls_base_sigkill_timeout), and SIGKILL one more second later or as soon
// as one of them exits, whichever comes first. While an MpiCommunicator
// exists, and unless the program had its own SIGTERM handler (which is then
// left alone), SIGTERM writes one line with write(2), waits 0.25 s and exits
// with status 143:
//   "headroom: rank 1 of 4 was stopped by the launcher during all_reduce_sum
//    (another rank of the job exited, or the job was cancelled)"
// The wait is for the other ranks: without it, the first rank's exit brings
// the SIGKILL before the slower ones have printed (2 of 40 four-rank jobs
// lost a line on a 2-core machine).
//
// Threads: MPI is initialized with MPI_THREAD_MULTIPLE when this class
// initializes it, and at least MPI_THREAD_SERIALIZED is required when the
// program did: calls may come from any thread, one at a time. Construct and
// destroy MpiCommunicators on one thread (they share the process's MPI state).
//
// Sizes: one MPI call carries an int count. Counts above the chunk limit
// (INT_MAX / 2 elements or bytes; set_chunk_limit lowers it, for tests) are
// split: all_reduce_sum and send / recv into consecutive chunks;
// reduce_scatter_sum and all_gather, whose MPI calls count size() blocks
// together, into one MPI_Ireduce / MPI_Ibcast per owner and chunk when size()
// blocks exceed the limit.

// OpenMPI's and MPICH's mpi.h would also pull in the MPI-2 C++ bindings
// (deprecated, and noisy under -Wextra); headroom uses the C API.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#include <signal.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "headroom/core/dtype.hpp"
#include "headroom/host/communicator.hpp"

namespace headroom::host {

namespace mpi_detail {

// State shared by every MpiCommunicator of the process (MPI itself is per process).
inline int instances = 0;              // MpiCommunicators alive (constructed and destroyed on one thread)
inline bool initialized_here = false;  // MPI_Init_thread was called by an MpiCommunicator
inline bool any_failed = false;     // a call failed: MPI_Finalize would wait for the missing rank
inline bool handler_installed = false;
inline struct sigaction previous_term {};
// Read by the SIGTERM handler: written before the handler is installed ...
inline char term_prefix[64] = "headroom: this rank";
inline std::size_t term_prefix_len = 19;
// ... and the name of the call in progress (a string literal), or null.
inline std::atomic<const char*> current_call{nullptr};
// How long the handler waits between its line and _exit.
inline constexpr long term_pause_ns = 250'000'000;

inline std::size_t append(char* buf, std::size_t at, std::size_t cap, const char* s) {
  while (*s && at + 1 < cap) buf[at++] = *s++;
  return at;
}

// Async-signal-safe: builds the line on the stack, one write(2), _exit.
inline void on_sigterm(int) {
  char line[384];
  std::size_t n = 0;
  for (std::size_t i = 0; i < term_prefix_len && n + 1 < sizeof line; ++i) line[n++] = term_prefix[i];
  const char* call = current_call.load(std::memory_order_relaxed);
  if (call) {
    n = append(line, n, sizeof line, " was stopped by the launcher during ");
    n = append(line, n, sizeof line, call);
  } else {
    n = append(line, n, sizeof line, " was stopped by the launcher between calls");
  }
  n = append(line, n, sizeof line, " (another rank of the job exited, or the job was cancelled)\n");
  ssize_t ignored = ::write(STDERR_FILENO, line, n);
  (void)ignored;
  // OpenMPI 4.1's launcher sends SIGKILL to every rank as soon as the first
  // one exits after its SIGTERM: the pause gives every other rank the time
  // to print its line too.
  struct timespec pause {};
  pause.tv_nsec = term_pause_ns;
  while (::nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
  ::_exit(143);
}

// Marks a call in progress for the SIGTERM handler.
class CallScope {
 public:
  explicit CallScope(const char* name) { current_call.store(name, std::memory_order_relaxed); }
  ~CallScope() { current_call.store(nullptr, std::memory_order_relaxed); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
};

inline std::string seconds(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return comm_detail::cat({"MPI error ", std::to_string(code)});
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace mpi_detail

class MpiCommunicator final : public Communicator {
 public:
  static constexpr std::int64_t default_chunk_limit = INT_MAX / 2;

  // Works on a duplicate of MPI_COMM_WORLD.
  explicit MpiCommunicator(std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : MpiCommunicator(MPI_COMM_WORLD, timeout) {}

  // Works on a duplicate of `base` (MPI_COMM_WORLD, or a communicator the
  // program made; then the program has initialized MPI). Initializes MPI
  // (MPI_THREAD_MULTIPLE) if nobody has, and then finalizes it when the last
  // MpiCommunicator goes; if the program initialized MPI, finalizing is its own.
  MpiCommunicator(MPI_Comm base, std::chrono::milliseconds timeout) : timeout_(timeout) {
    if (timeout.count() <= 0) throw std::invalid_argument("MpiCommunicator: the timeout must be positive");
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      throw communication_error("MpiCommunicator: MPI was already finalized; it cannot be initialized again");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS)
        throw communication_error(comm_detail::cat({"MpiCommunicator: MPI_Init_thread failed: ", mpi_detail::error_string(rc)}));
      mpi_detail::initialized_here = true;
      if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        throw communication_error(comm_detail::cat({"MpiCommunicator: this MPI library provides thread level ",
                                                    std::to_string(provided),
                                                    ", below MPI_THREAD_SERIALIZED; the engine calls MPI from a second thread"}));
      }
    } else {
      int provided = 0;
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_SERIALIZED)
        throw communication_error(
            "MpiCommunicator: MPI was initialized below MPI_THREAD_SERIALIZED (the engine calls MPI from a second "
            "thread): initialize it with MPI_Init_thread(..., MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, ...)");
    }
    ++mpi_detail::instances;
    keep_freed_memory();
    MPI_Comm_rank(base, &rank_);
    MPI_Comm_size(base, &size_);
    install_handler();
    try {
      // Errors on `base` itself follow the program's handler for it (by
      // default fatal); the duplicate's return codes.
      mpi_detail::CallScope scope("the communicator's creation");
      const Call call{"the communicator's creation (MPI_Comm_idup)"};
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Comm_idup(base, &comm_, &req), "MPI_Comm_idup", call);
      wait(req, call);
    } catch (...) {
      if (--mpi_detail::instances == 0) restore_handler();
      throw;
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int flag = 0;
    void* ub = nullptr;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    if (flag && ub) tag_ub_ = *static_cast<int*>(ub);
  }

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  ~MpiCommunicator() override {
    if (failed_.empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (--mpi_detail::instances == 0) {
      restore_handler();
      if (mpi_detail::initialized_here && !mpi_detail::any_failed) {
        MPI_Finalize();
        mpi_detail::initialized_here = false;
      }
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* data, std::int64_t n, DType t) override {
    mpi_detail::CallScope scope("all_reduce_sum");
    MPI_Datatype type = mpi_type(t, "all_reduce_sum");
    check_count(n, "all_reduce_sum");
    usable("all_reduce_sum");
    char* p = static_cast<char*>(data);
    const std::int64_t es = size_of(t);
    const std::int64_t chunks = chunk_count(n);
    for (std::int64_t c = 0, off = 0; off < n; ++c, off += chunk_) {
      const int len = static_cast<int>(std::min(chunk_, n - off));
      const Call call = Call::typed("all_reduce_sum", n, t, 1, c, chunks);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Iallreduce(MPI_IN_PLACE, p + off * es, len, type, MPI_SUM, comm_, &req), "MPI_Iallreduce", call);
      wait(req, call);
    }
  }

  void reduce_scatter_sum(const void* send, void* recv, std::int64_t n, DType t) override {
    mpi_detail::CallScope scope("reduce_scatter_sum");
    MPI_Datatype type = mpi_type(t, "reduce_scatter_sum");
    check_count(n, "reduce_scatter_sum");
    usable("reduce_scatter_sum");
    if (n == 0) return;
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    const std::int64_t es = size_of(t);
    if (n <= chunk_ / size_) {  // the MPI call counts all size() blocks in an int
      const Call call = Call::typed("reduce_scatter_sum", n, t, size_, 0, 1);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Ireduce_scatter_block(s, r, static_cast<int>(n), type, MPI_SUM, comm_, &req),
            "MPI_Ireduce_scatter_block", call);
      wait(req, call);
      return;
    }
    // One reduction to each block's owner, chunk by chunk.
    const std::int64_t chunks = chunk_count(n) * size_;
    std::int64_t c = 0;
    for (int owner = 0; owner < size_; ++owner) {
      for (std::int64_t off = 0; off < n; off += chunk_, ++c) {
        const int len = static_cast<int>(std::min(chunk_, n - off));
        const Call call = Call::typed("reduce_scatter_sum", n, t, size_, c, chunks);
        MPI_Request req = MPI_REQUEST_NULL;
        check(MPI_Ireduce(s + (static_cast<std::int64_t>(owner) * n + off) * es, owner == rank_ ? r + off * es : nullptr,
                          len, type, MPI_SUM, owner, comm_, &req),
              "MPI_Ireduce", call);
        wait(req, call);
      }
    }
  }

  void all_gather(void* data, std::int64_t block_bytes) override {
    mpi_detail::CallScope scope("all_gather");
    check_count(block_bytes, "all_gather");
    usable("all_gather");
    if (block_bytes == 0) return;
    char* p = static_cast<char*>(data);
    if (block_bytes <= chunk_ / size_) {  // the MPI call counts all size() blocks in an int
      const Call call = Call::bytes("all_gather", block_bytes, size_, 0, 1);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, static_cast<int>(block_bytes), MPI_BYTE, comm_, &req),
            "MPI_Iallgather", call);
      wait(req, call);
      return;
    }
    // One broadcast from each block's owner, chunk by chunk.
    const std::int64_t chunks = chunk_count(block_bytes) * size_;
    std::int64_t c = 0;
    for (int owner = 0; owner < size_; ++owner) {
      for (std::int64_t off = 0; off < block_bytes; off += chunk_, ++c) {
        const int len = static_cast<int>(std::min(chunk_, block_bytes - off));
        const Call call = Call::bytes("all_gather", block_bytes, size_, c, chunks);
        MPI_Request req = MPI_REQUEST_NULL;
        check(MPI_Ibcast(p + static_cast<std::int64_t>(owner) * block_bytes + off, len, MPI_BYTE, owner, comm_, &req),
              "MPI_Ibcast", call);
        wait(req, call);
      }
    }
  }

  void send(const void* data, std::int64_t bytes, int peer, int tag) override {
    mpi_detail::CallScope scope("send");
    for (auto& [req, call] : post_send(data, bytes, peer, tag)) wait(req, call);
  }

  // The send's chunks are posted now (MPI_Isend) and waited for, against
  // the timeout, by finish_send.
  void begin_send(const void* data, std::int64_t bytes, int peer, int tag) override {
    mpi_detail::CallScope scope("send");
    pending_sends_[{peer, tag}].push_back(post_send(data, bytes, peer, tag));
  }
  void finish_send(int peer, int tag) override {
    mpi_detail::CallScope scope("send");
    usable("send");
    auto it = pending_sends_.find({peer, tag});
    if (it == pending_sends_.end() || it->second.empty())
      throw std::logic_error(comm_detail::cat({who(), ": finish_send to rank ", std::to_string(peer), " (tag ", std::to_string(tag),
                                               ") without a send begun"}));
    PendingSend pending = std::move(it->second.front());
    it->second.pop_front();
    for (auto& [req, call] : pending) wait(req, call);
  }

  void recv(void* data, std::int64_t bytes, int peer, int tag) override {
    mpi_detail::CallScope scope("recv");
    check_peer(peer, tag, "recv");
    check_count(bytes, "recv");
    usable("recv");
    char* p = static_cast<char*>(data);
    const std::int64_t chunks = chunk_count(bytes);
    for (std::int64_t c = 0, off = 0; off < bytes; ++c, off += chunk_) {
      const int len = static_cast<int>(std::min(chunk_, bytes - off));
      const Call call = Call::p2p("recv", bytes, peer, tag, c, chunks);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Irecv(p + off, len, MPI_BYTE, peer, tag, comm_, &req), "MPI_Irecv", call);
      MPI_Status status = wait(req, call);
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (got != len)
        fail(comm_detail::cat({call.describe(), " received ", std::to_string(got), " bytes where ", std::to_string(len),
                               " were expected; the ranks disagree on the message size"}));
    }
  }

  void barrier() override {
    mpi_detail::CallScope scope("barrier");
    usable("barrier");
    const Call call{"barrier"};
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", call);
    wait(req, call);
  }

  // A group of this communicator's ranks (MPI_Comm_split, which blocks: the
  // trainer splits right after every rank has answered agree()); the group
  // works on its own duplicate, with this one's timeout.
  std::unique_ptr<Communicator> split(int color, int key) override {
    mpi_detail::CallScope scope("split");
    usable("split");
    const Call call{"split"};
    MPI_Comm part = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split", call);
    auto group = std::make_unique<MpiCommunicator>(part, timeout_);
    MPI_Comm_free(&part);
    return group;
  }

  // Prints "headroom: rank R of N aborts the job: <why>" and ends every rank
  // of the job (MPI_Abort, exit status 1).
  [[noreturn]] void abort(const std::string& why) {
    std::fprintf(stderr, "headroom: %s aborts the job: %s\n", who().c_str(), why.c_str());
    std::fflush(stderr);
    // The launcher's SIGTERM to this rank is part of the abort, not news.
    restore_handler();
    MPI_Abort(MPI_COMM_WORLD, 1);  // the whole job
    std::abort();
  }

  // The duplicated communicator (for a program's own MPI calls).
  MPI_Comm comm() const { return comm_; }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0) throw std::invalid_argument("MpiCommunicator: the timeout must be positive");
    timeout_ = t;
  }

  // The most elements (or bytes) one MPI call carries; default INT_MAX / 2.
  // Lowered by tests to exercise the chunked paths. Every rank must use the same limit.
  std::int64_t chunk_limit() const { return chunk_; }
  void set_chunk_limit(std::int64_t elements) {
    if (elements < 1 || elements > default_chunk_limit)
      throw std::invalid_argument("MpiCommunicator: the chunk limit must be in [1, INT_MAX / 2]");
    chunk_ = elements;
  }

  // How a call waits (MPI progresses only inside MPI calls): MPI_Test in a
  // tight loop for the first spin_for of each MPI operation, then with a
  // sleep of `sleep` between tests, which leaves the core to the compute
  // threads and to other ranks on an oversubscribed machine.
  struct Polling {
    std::chrono::microseconds spin_for{1000};
    std::chrono::microseconds sleep{50};
  };
  Polling polling() const { return polling_; }
  void set_polling(Polling p) { polling_ = p; }

  // True once a call has failed (timed out or got an MPI error): every later call throws.
  bool failed() const { return !failed_.empty(); }

  // MPI's reductions (all-reduce, reduce-scatter) allocate a temporary as
  // large as their message for every call. glibc maps an allocation above its
  // mmap threshold fresh from the kernel and unmaps it when freed, so every
  // call page-faults its temporary in again: in a virtual machine that cost
  // ten times the reduction itself (a 256 MiB all-reduce of 2 ranks: 0.9-1.3 s,
  // against 0.08-0.10 s once the memory is reused; 2-core AMD EPYC VM,
  // OpenMPI 4.1.4). Unless the environment sets them (MALLOC_MMAP_THRESHOLD_,
  // MALLOC_TRIM_THRESHOLD_), the first communicator raises both thresholds to
  // 1 GiB: freed blocks stay in the heap for the next call. MPI's temporaries
  // then stay resident between calls (at most about the largest message).
  static void keep_freed_memory() {
#if defined(__GLIBC__)
    static const bool done = [] {
      if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 30);
      if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 1 << 30);
      return true;
    }();
    (void)done;
#endif
  }

 private:
  // What a call is, for its messages.
  struct Call {
    const char* name;
    bool sized = false;
    std::int64_t n = 0;  // elements (typed calls) or bytes
    std::optional<DType> type = std::nullopt;
    int blocks = 1;         // size() for reduce_scatter / all_gather
    int peer = -1, tag = -1;  // send / recv
    std::int64_t chunk = 0, chunks = 1;

    static Call typed(const char* name, std::int64_t n, DType t, int blocks, std::int64_t chunk, std::int64_t chunks) {
      return {name, true, n, t, blocks, -1, -1, chunk, chunks};
    }
    static Call bytes(const char* name, std::int64_t n, int blocks, std::int64_t chunk, std::int64_t chunks) {
      return {name, true, n, std::nullopt, blocks, -1, -1, chunk, chunks};
    }
    static Call p2p(const char* name, std::int64_t n, int peer, int tag, std::int64_t chunk, std::int64_t chunks) {
      return {name, true, n, std::nullopt, 1, peer, tag, chunk, chunks};
    }

    // "all_reduce_sum of 4096 f32", "all_gather of 4 x 256 bytes (chunk 2 of 8)", "send of 64 bytes to rank 1 (tag 3)"
    std::string describe() const {
      std::string s = name;
      if (!sized) return s;
      s += " of ";
      if (blocks > 1) s += comm_detail::cat({std::to_string(blocks), " x "});
      s += std::to_string(n);
      s += " ";
      s += type ? name_of(*type) : std::string_view("bytes");
      if (peer >= 0)
        s += comm_detail::cat({std::string_view(name) == "send" ? " to rank " : " from rank ", std::to_string(peer),
                               " (tag ", std::to_string(tag), ")"});
      if (chunks > 1) s += comm_detail::cat({" (chunk ", std::to_string(chunk + 1), " of ", std::to_string(chunks), ")"});
      return s;
    }
  };

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  // begin_send's messages not yet finished, per (peer, tag), oldest first: each its chunks' requests
  using PendingSend = std::vector<std::pair<MPI_Request, Call>>;
  std::map<std::pair<int, int>, std::deque<PendingSend>> pending_sends_;
  int tag_ub_ = 32767;
  std::chrono::milliseconds timeout_;
  std::int64_t chunk_ = default_chunk_limit;
  Polling polling_{};
  std::string failed_;  // the first failure, without "rank R of N: "

  std::int64_t chunk_count(std::int64_t n) const { return n == 0 ? 0 : (n + chunk_ - 1) / chunk_; }

  // Posts a send's chunks (MPI_Isend): their requests, to be waited for.
  PendingSend post_send(const void* data, std::int64_t bytes, int peer, int tag) {
    check_peer(peer, tag, "send");
    check_count(bytes, "send");
    usable("send");
    const char* p = static_cast<const char*>(data);
    const std::int64_t chunks = chunk_count(bytes);
    PendingSend posted;
    for (std::int64_t c = 0, off = 0; off < bytes; ++c, off += chunk_) {
      const int len = static_cast<int>(std::min(chunk_, bytes - off));
      const Call call = Call::p2p("send", bytes, peer, tag, c, chunks);
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Isend(p + off, len, MPI_BYTE, peer, tag, comm_, &req), "MPI_Isend", call);
      posted.push_back({req, call});
    }
    return posted;
  }

  static MPI_Datatype mpi_type(DType t, const char* call) {
    if (t == DType::F32) return MPI_FLOAT;
    if (t == DType::F64) return MPI_DOUBLE;
    throw std::invalid_argument(comm_detail::cat({call, ": the element type must be f32 or f64, not ", name_of(t)}));
  }
  static void check_count(std::int64_t n, const char* call) {
    if (n < 0) throw std::invalid_argument(comm_detail::cat({call, ": negative count ", std::to_string(n)}));
  }
  void check_peer(int peer, int tag, const char* call) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw std::invalid_argument(comm_detail::cat({who(), ": ", call, " to or from rank ", std::to_string(peer),
                                                   ": the peer must be another rank of the job (0 .. ",
                                                   std::to_string(size_ - 1), ")"}));
    if (tag < 0 || tag > tag_ub_)
      throw std::invalid_argument(comm_detail::cat({who(), ": ", call, " with tag ", std::to_string(tag), ": tags are 0 .. ",
                                                   std::to_string(tag_ub_)}));
  }
  void usable(const char* call) const {
    if (!failed_.empty())
      throw communication_error(
          comm_detail::cat({who(), ": ", call, " refused: this communicator failed earlier (", failed_, ")"}));
  }

  [[noreturn]] void fail(std::string what) {
    failed_ = std::move(what);
    mpi_detail::any_failed = true;
    throw communication_error(comm_detail::cat({who(), ": ", failed_}));
  }
  void check(int rc, const char* function, const Call& call) {
    if (rc != MPI_SUCCESS)
      fail(comm_detail::cat({call.describe(), " failed: ", function, ": ", mpi_detail::error_string(rc)}));
  }

  // Polls req until it completes or the timeout passes; returns its status.
  MPI_Status wait(MPI_Request& req, const Call& call) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + timeout_;
    while (true) {
      int done = 0;
      MPI_Status status;
      int rc = MPI_Test(&req, &done, &status);
      if (rc != MPI_SUCCESS)
        fail(comm_detail::cat({call.describe(), " failed: MPI_Test: ", mpi_detail::error_string(rc)}));
      if (done) return status;
      const auto now = clock::now();
      if (now >= deadline) {
        const std::string others =
            call.peer >= 0 ? comm_detail::cat({"rank ", std::to_string(call.peer)}) : std::string("another rank");
        fail(comm_detail::cat({call.describe(), " did not complete within ", mpi_detail::seconds(timeout_), "; ", others,
                               " has stopped or hangs"}));
      }
      if (now - start >= polling_.spin_for) std::this_thread::sleep_for(polling_.sleep);
    }
  }

  void install_handler() {
    if (mpi_detail::instances != 1) return;
    int wrank = 0, wsize = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    int n = std::snprintf(mpi_detail::term_prefix, sizeof mpi_detail::term_prefix, "headroom: rank %d of %d", wrank,
                          wsize);
    mpi_detail::term_prefix_len = n > 0 ? static_cast<std::size_t>(n) : 0;
    struct sigaction current {};
    sigaction(SIGTERM, nullptr, &current);
    if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) return;  // the program's own (or ignored)
    struct sigaction ours {};
    ours.sa_handler = &mpi_detail::on_sigterm;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = 0;
    if (sigaction(SIGTERM, &ours, &mpi_detail::previous_term) == 0) mpi_detail::handler_installed = true;
  }
  static void restore_handler() {
    if (!mpi_detail::handler_installed) return;
    sigaction(SIGTERM, &mpi_detail::previous_term, nullptr);
    mpi_detail::handler_installed = false;
  }
};

}  // namespace headroom::host
