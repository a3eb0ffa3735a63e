#pragma once
// NCCL for the CPU emulator (tests only): g++ definitions of the NCCL
// functions headroom/cuda/nccl.cuh calls, so that cuda::NcclCommunicator and
// data-parallel cuda::Trainer runs work without a GPU. Include it after
// runtime_emulator.hpp; like it, every function is the extern "C" one that
// nccl.h declares, defined `inline`.
//
// Ranks are processes. ncclGetUniqueId maps a shared anonymous segment and
// puts its address in the id: the processes that fork() after it (and only
// they) share it, which stands for the broadcast of the id. A rank joins with
// ncclCommInitRank(Config) and the collectives really exchange the bytes
// through that segment: a rank copies its part into its slot, waits until
// every rank has posted the same round, and computes the result from all the
// slots in rank order (sums in f32, or f64 for f64, rounded once to the
// element type), so every rank gets the same bits. Payloads above a slot
// (1 MiB) go in rounds. At most 8 ranks; ncclSum only; f32, f64, bf16, f16
// and 8-bit types.
//
// Execution, as the runtime emulator's (runtime_emulator.hpp): a collective
// happens at the call, on a stream created by cudaStreamCreate* (the legacy
// stream is refused), or is recorded into an active stream capture and
// happens at each replay. At the call the host waits for the other ranks,
// up to nccl_hang_after() (30 s unless a test sets it):
//   - a rank that does not come in that time makes the collective hung: it
//     never completes (runtime_emulator.hpp's hung work: cudaStreamQuery of
//     its stream, or of a stream that waited on an event after it, says
//     cudaErrorNotReady), nor does any later collective of the communicator,
//     until ncclCommAbort releases them; ncclCommGetAsyncError says
//     ncclSuccess, as NCCL does for a peer that hangs;
//   - a rank whose process has exited, or that aborted its communicator,
//     fails the collective: ncclCommGetAsyncError says ncclRemoteError and
//     ncclGetLastError names the rank;
//   - ranks calling different collectives, counts or types in the same
//     round fail it with ncclInvalidUsage (NCCL would hang or corrupt
//     memory; the emulator is stricter).
// A failed collective, and every later one of the communicator, never
// completes either (on a GPU NCCL's kernels spin until ncclCommAbort) and
// does nothing. Stricter than
// NCCL too: every buffer must lie inside one live cudaMalloc block.
// A communicator configured non-blocking (ncclConfig_t::blocking = 0)
// returns ncclInProgress from joining until every rank has joined
// (ncclCommGetAsyncError then says ncclSuccess); collectives return at once.
//
// Point-to-point transfers (ncclSend, ncclRecv) are rendezvous operations,
// as NCCL documents them: a send completes only once the peer has posted the
// matching receive (and taken the bytes), a receive once the matching send
// has come, matched in order per (sender, receiver) pair. A send or receive
// outside a group runs alone, at its call; between ncclGroupStart and
// ncclGroupEnd they are collected and run together at ncclGroupEnd, so that
// a rank that sends to a peer and receives from it in one group completes
// while the peer does the same. Two ranks that each send to the other
// outside a group therefore wait for each other, and after nccl_hang_after()
// the sends are hung work, as on a GPU, where such sends never complete: the
// emulator does not hide the deadlock a wrong order makes. The bytes pass
// through a 64 KiB channel per ordered pair of ranks, chunk by chunk; the
// sizes of a matched send and receive must agree (else ncclInvalidUsage on
// both). A group holds sends and receives of one communicator on one stream
// (no collectives); p2p_bytes() counts what this process sent and received.
//
// ncclCommSplit (a collective of the parent, as NCCL's): each rank posts its
// color and key in the parent's segment and waits (up to nccl_hang_after())
// for every rank's; the ranks of a color join a child segment, ranked by
// (key, parent rank). The children's segments are mapped with the id's own
// by ncclGetUniqueId (before the fork, so every rank shares them): a pool of
// pool_segments - 1, from which the color's lowest parent rank takes the
// next free one and posts its number for the color's other ranks. Any
// communicator, a child too, splits up to max_splits times; a split that
// finds the pool empty fails on every rank of the color (ncclInternalError,
// naming the pool's size). Pages are touched only when used, so the pool
// costs address space, not memory.
#if defined(__CUDACC__)
#error "nccl_emulator.hpp is for g++ builds; nvcc programs link the real NCCL"
#endif

#include <nccl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime_emulator.hpp"

namespace headroom::cuda_emulator {

// How long a collective waits at its call for the other ranks before it is hung (see above).
inline std::chrono::milliseconds& nccl_hang_after() {
  static std::chrono::milliseconds t{30000};
  return t;
}

namespace nccl_detail {

inline constexpr int max_ranks = 8;
inline constexpr std::size_t slot_bytes = std::size_t{1} << 20;
inline constexpr std::uint64_t id_magic = 0x6e63636c2d656d75ULL;  // "nccl-emu"
inline constexpr int max_splits = 8;      // ncclCommSplit calls of one communicator (parent or child)
inline constexpr int pool_segments = 48;  // segments mapped per id: the id's and its communicators' children's
inline constexpr std::size_t p2p_chunk = std::size_t{1} << 16;

enum class Kind : std::int32_t { none, all_reduce, reduce_scatter, all_gather };
inline const char* name_of(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    default: return "?";
  }
}
// One rank's call in a round: its collective, element type and count (all_reduce:
// the elements; reduce_scatter: per rank; all_gather: sent per rank).
struct Desc {
  Kind kind;
  std::int32_t type;
  std::uint64_t count;
  bool operator==(const Desc&) const = default;
};
struct RankState {
  std::atomic<std::int64_t> pid;      // 0 until the rank joins
  std::atomic<std::uint64_t> posted;  // the last round whose part is in its slot
  std::atomic<std::int32_t> aborted;  // ncclCommAbort was called
  Desc desc[2];                       // the call of the round posted, by parity
};
// One rank's part of a split: its color and key, then posted = 1; the
// color's lowest rank then sets `child` to 1 + the pool index of the color's
// segment (or to no_child when the pool is empty).
struct SplitPost {
  std::atomic<std::int32_t> posted;
  std::int32_t color, key;
  std::atomic<std::int32_t> child;
};
inline constexpr std::int32_t no_child = -1;
// The point-to-point transfers from one rank to another, in order: the
// sender announces each send (send_bytes, then sends), the receiver each
// receive (recv_bytes, then recvs); once both are posted the bytes pass
// through `data`, one chunk at a time (written / read: chunks since the
// channel began).
struct Channel {
  std::atomic<std::uint64_t> sends, recvs, written, read;
  std::uint64_t send_bytes, recv_bytes;
  unsigned char data[p2p_chunk];
};
// The shared segment of one id. Round r's part of rank q is in data[q][r % 2]:
// rank q writes round r + 2 there only after every rank posted r + 1, that is
// after every rank has read round r.
struct Segment {
  std::uint64_t magic;
  std::atomic<std::int32_t> nranks;  // set by the first rank to join
  std::atomic<std::int32_t> joined;
  RankState rank[max_ranks];
  Segment* pool;                             // the id's segment: the children's follow it
  std::atomic<std::int32_t> children;        // (the id's segment) children's segments taken so far
  SplitPost split[max_splits][max_ranks];    // the ranks' parts of split s
  Channel p2p[max_ranks][max_ranks];         // [sender][receiver]
  alignas(256) unsigned char data[max_ranks][2][slot_bytes];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free,
              "nccl_emulator: ranks in other processes share the segment's atomics");

struct Comm {
  Segment* seg;
  int rank, nranks;
  std::uint64_t round = 0;
  ncclResult_t async = ncclSuccess;  // ncclInProgress while joining (non-blocking); an error once failed
  std::string last_error;
  std::uint64_t hung = 0;  // the hung work behind which its collectives wait (0: none)
  int splits = 0;          // ncclCommSplit calls of this communicator so far (the same on every rank)
  // point to point, per peer: sends and receives posted, chunks written to it and read from it
  std::uint64_t sent_to[max_ranks] = {}, received_from[max_ranks] = {};
  std::uint64_t chunks_out[max_ranks] = {}, chunks_in[max_ranks] = {};
};

inline std::string& global_last_error() {
  static std::string e;
  return e;
}
inline ncclResult_t fail(Comm* c, ncclResult_t r, const std::string& why) {
  if (c != nullptr) {
    c->async = r;
    c->last_error = why;
  } else {
    global_last_error() = why;
  }
  return r;
}

inline std::size_t element_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    default: return 0;
  }
}
inline double load(ncclDataType_t t, const unsigned char* p) {
  switch (t) {
    case ncclFloat16: { __half h; std::memcpy(&h, p, 2); return static_cast<double>(__half2float(h)); }
    case ncclBfloat16: { __nv_bfloat16 h; std::memcpy(&h, p, 2); return static_cast<double>(__bfloat162float(h)); }
    case ncclFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    default: { double d; std::memcpy(&d, p, 8); return d; }
  }
}
inline void store(ncclDataType_t t, unsigned char* p, double v) {
  switch (t) {
    case ncclFloat16: { const __half h = __float2half(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    case ncclBfloat16: { const __nv_bfloat16 h = __float2bfloat16(static_cast<float>(v)); std::memcpy(p, &h, 2); return; }
    case ncclFloat32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    default: std::memcpy(p, &v, 8); return;
  }
}
// out[i] = sum over ranks q (in order) of part q's element i: f32 sums for
// f32 and 16-bit types, f64 for f64.
inline void sum_parts(ncclDataType_t t, const unsigned char* const* parts, int n, std::size_t count, unsigned char* out) {
  const std::size_t e = element_bytes(t);
  for (std::size_t i = 0; i < count; ++i) {
    if (t == ncclFloat64) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += load(t, parts[q] + i * e);
      store(t, out + i * e, s);
    } else {
      float s = 0;
      for (int q = 0; q < n; ++q) s += static_cast<float>(load(t, parts[q] + i * e));
      store(t, out + i * e, s);
    }
  }
}

// Whether process `pid` still runs (not exited, not a zombie).
inline bool alive(std::int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return false;
  const std::size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

inline void pause(int& round) {
  if (++round < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(round < 256 ? 20 : 500));
}

enum class Waited { done, hung, failed };
// Waits until every rank has posted round r (see the top of the file).
inline Waited await_round(Comm* c, std::uint64_t r, const Desc& mine) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto checked = start;
  int spins = 0;
  for (;;) {
    bool all = true;
    for (int q = 0; q < c->nranks; ++q) {
      const RankState& s = c->seg->rank[q];
      if (q != c->rank && s.aborted.load(std::memory_order_acquire) != 0) {
        fail(c, ncclRemoteError, "rank " + std::to_string(q) + " aborted its communicator during " + name_of(mine.kind));
        return Waited::failed;
      }
      if (s.posted.load(std::memory_order_acquire) < r) all = false;
    }
    if (all) {
      for (int q = 0; q < c->nranks; ++q) {
        const Desc& d = c->seg->rank[q].desc[r % 2];
        if (!(d == mine)) {
          fail(c, ncclInvalidUsage,
               "ranks call different collectives: rank " + std::to_string(c->rank) + " " + name_of(mine.kind) + " of " +
                   std::to_string(mine.count) + " (type " + std::to_string(mine.type) + "), rank " + std::to_string(q) + " " +
                   name_of(d.kind) + " of " + std::to_string(d.count) + " (type " + std::to_string(d.type) + ")");
          return Waited::failed;
        }
      }
      return Waited::done;
    }
    const auto now = clock::now();
    if (now - checked > std::chrono::milliseconds(20)) {
      checked = now;
      for (int q = 0; q < c->nranks; ++q) {
        const RankState& s = c->seg->rank[q];
        if (s.posted.load(std::memory_order_acquire) < r && !alive(s.pid.load())) {
          fail(c, ncclRemoteError,
               "rank " + std::to_string(q) + " (process " + std::to_string(s.pid.load()) + ") has exited during " + name_of(mine.kind));
          return Waited::failed;
        }
      }
    }
    if (now - start > nccl_hang_after()) return Waited::hung;
    pause(spins);
  }
}

// The collective's work never completes: `stream` (and the communicator's later collectives) wait behind it.
inline void hang(Comm* c, cudaStream_t stream) {
  using namespace runtime_detail;
  static std::uint64_t hung_count = 0;
  if (c->hung == 0) {
    c->hung = ++hung_count;
    hung_work().insert(c->hung);
  }
  if (Stream* s = find<Stream>(stream); s != nullptr) s->behind.push_back(c->hung);
}

// One collective, round by round, at its call or at a replay (into `stream`).
inline void run(Comm* c, Desc d, ncclDataType_t t, const unsigned char* send, unsigned char* recv, cudaStream_t stream) {
  using namespace runtime_detail;
  const Stream* s = find<Stream>(stream);
  if (c->async != ncclSuccess || c->hung != 0 || (s != nullptr && blocked(s->behind))) {  // failed, or behind hung work
    hang(c, stream);
    return;
  }
  const std::size_t e = element_bytes(t), n = static_cast<std::size_t>(c->nranks);
  const std::size_t per_round = d.kind == Kind::reduce_scatter ? slot_bytes / (e * n) : slot_bytes / e;  // elements
  RankState& me = c->seg->rank[c->rank];
  for (std::size_t at = 0; at < d.count; at += per_round) {
    const std::size_t m = std::min(per_round, static_cast<std::size_t>(d.count) - at);
    const std::uint64_t r = ++c->round;
    unsigned char* slot = c->seg->data[c->rank][r % 2];
    if (d.kind == Kind::reduce_scatter)  // every rank's block [at, at + m), block after block
      for (std::size_t b = 0; b < n; ++b) std::memcpy(slot + b * m * e, send + (b * d.count + at) * e, m * e);
    else
      std::memcpy(slot, send + at * e, m * e);
    me.desc[r % 2] = d;
    me.posted.store(r, std::memory_order_release);
    if (await_round(c, r, d) != Waited::done) {  // hung, or failed (then hung too, as NCCL's kernels spin until the abort)
      hang(c, stream);
      return;
    }
    const unsigned char* parts[max_ranks];
    for (std::size_t q = 0; q < n; ++q) parts[q] = c->seg->data[q][r % 2];
    if (d.kind == Kind::all_gather) {
      for (std::size_t q = 0; q < n; ++q) std::memcpy(recv + (q * d.count + at) * e, parts[q], m * e);
    } else {
      if (d.kind == Kind::reduce_scatter)
        for (std::size_t q = 0; q < n; ++q) parts[q] += static_cast<std::size_t>(c->rank) * m * e;
      sum_parts(t, parts, c->nranks, m, recv + at * e);
    }
  }
}

// ---- point to point (their group is also checked by the collectives) ----------------------------------------

// One send or receive of a group.
struct P2p {
  bool send;
  int peer;
  unsigned char* data;  // a send's bytes are only read
  std::uint64_t bytes;
};
// The group being collected between ncclGroupStart and ncclGroupEnd (one thread's).
struct Group {
  int depth = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<P2p> ops;
  ncclResult_t error = ncclSuccess;  // a call of the group that was refused
};
inline Group& group() {
  thread_local Group g;
  return g;
}

// Checks a collective's arguments and runs or records it.
inline ncclResult_t enqueue(ncclComm_t comm, Kind kind, const void* send, void* recv, std::size_t count, ncclDataType_t t,
                            ncclRedOp_t op, cudaStream_t stream) {
  using namespace runtime_detail;
  Comm* c = find<Comm>(comm);
  if (c == nullptr) return fail(nullptr, ncclInvalidArgument, std::string(name_of(kind)) + ": not a live communicator");
  if (c->async == ncclInProgress) return fail(c, ncclInvalidUsage, std::string(name_of(kind)) + " before the communicator joined");
  if (group().depth > 0)
    return fail(c, ncclInvalidUsage, std::string(name_of(kind)) + " inside ncclGroupStart / ncclGroupEnd: the emulator groups sends and receives only");
  const std::size_t e = element_bytes(t);
  if (e == 0) return fail(c, ncclInvalidArgument, std::string(name_of(kind)) + ": the emulator has no data type " + std::to_string(t));
  if (kind != Kind::all_gather && (op != ncclSum || e == 1))
    return fail(c, ncclInvalidArgument, std::string(name_of(kind)) + ": the emulator reduces floating types with ncclSum only");
  if (is_legacy(stream) || stream == cudaStreamPerThread || find<Stream>(stream) == nullptr)
    return fail(c, ncclInvalidArgument, std::string(name_of(kind)) + ": the emulator runs collectives on streams made by cudaStreamCreate*");
  if (count == 0) return ncclSuccess;
  const std::size_t n = static_cast<std::size_t>(c->nranks);
  const std::size_t send_bytes = (kind == Kind::reduce_scatter ? n : 1) * count * e;
  const std::size_t recv_bytes = (kind == Kind::all_gather ? n : 1) * count * e;
  if (!device_accessible(send, send_bytes) || !device_accessible(recv, recv_bytes))
    return fail(c, ncclInvalidArgument,
                std::string(name_of(kind)) + ": a buffer is not inside one live cudaMalloc block (send " + std::to_string(send_bytes) +
                    " bytes, receive " + std::to_string(recv_bytes) + ")");
  const Desc d{kind, static_cast<std::int32_t>(t), count};
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  bool record_it = false;
  if (route(stream, record_it) != cudaSuccess) return fail(c, ncclUnhandledCudaError, std::string(name_of(kind)) + ": the stream refused it");
  if (!record_it) {
    run(c, d, t, in, out, stream);
    return ncclSuccess;
  }
  record(stream, [comm, d, t, in, out] {
    Comm* live_comm = find<Comm>(comm);
    if (live_comm == nullptr) return cudaErrorInvalidResourceHandle;
    run(live_comm, d, t, in, out, replay_stream());
    return cudaSuccess;
  });
  return ncclSuccess;
}

}  // namespace nccl_detail

// What this process has sent and received point to point (every communicator).
struct P2pBytes {
  std::int64_t sent = 0, received = 0;
};
inline P2pBytes& p2p_bytes() {
  static P2pBytes b;
  return b;
}

namespace nccl_detail {

// A group of sends and receives, at its ncclGroupEnd or at a replay (into
// `stream`): each is posted on its channel, then all progress together until
// every one has completed (a send: its receiver took every chunk; a receive:
// every chunk of the matching send arrived), or the group hangs or fails as
// a collective does (see the top of the file).
inline void run_p2p(Comm* c, const std::vector<P2p>& ops, cudaStream_t stream) {
  using namespace runtime_detail;
  const Stream* s = find<Stream>(stream);
  if (c->async != ncclSuccess || c->hung != 0 || (s != nullptr && blocked(s->behind))) {
    hang(c, stream);
    return;
  }
  struct State {
    std::uint64_t seq = 0, base = 0, chunks = 0, moved = 0;
    bool matched = false, done = false;
  };
  std::vector<State> st(ops.size());
  auto channel = [c](const P2p& op) -> Channel& { return op.send ? c->seg->p2p[c->rank][op.peer] : c->seg->p2p[op.peer][c->rank]; };
  for (std::size_t i = 0; i < ops.size(); ++i) {  // post every one first: they progress together
    const P2p& op = ops[i];
    Channel& ch = channel(op);
    State& x = st[i];
    x.chunks = (op.bytes + p2p_chunk - 1) / p2p_chunk;
    if (op.send) {
      x.seq = ++c->sent_to[op.peer];
      x.base = c->chunks_out[op.peer];
      ch.send_bytes = op.bytes;
      ch.sends.store(x.seq, std::memory_order_release);
    } else {
      x.seq = ++c->received_from[op.peer];
      x.base = c->chunks_in[op.peer];
      ch.recv_bytes = op.bytes;
      ch.recvs.store(x.seq, std::memory_order_release);
    }
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto checked = start;
  int spins = 0;
  for (;;) {
    bool all = true, progressed = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const P2p& op = ops[i];
      State& x = st[i];
      if (x.done) continue;
      Channel& ch = channel(op);
      if (!x.matched) {  // the rendezvous: the peer has posted the matching call
        if ((op.send ? ch.recvs : ch.sends).load(std::memory_order_acquire) < x.seq) {
          all = false;
          continue;
        }
        const std::uint64_t theirs = op.send ? ch.recv_bytes : ch.send_bytes;
        if (theirs != op.bytes) {
          fail(c, ncclInvalidUsage,
               std::string(op.send ? "ncclSend of " : "ncclRecv of ") + std::to_string(op.bytes) + " bytes " +
                   (op.send ? "to" : "from") + " rank " + std::to_string(op.peer) + " matched a " + (op.send ? "receive" : "send") +
                   " of " + std::to_string(theirs) + " bytes");
          hang(c, stream);
          return;
        }
        x.matched = progressed = true;
      }
      const std::uint64_t at = x.base + x.moved;  // the next chunk's number on the channel
      if (op.send) {
        if (x.moved < x.chunks && ch.written.load(std::memory_order_acquire) == at && ch.read.load(std::memory_order_acquire) == at) {
          const std::uint64_t n = std::min<std::uint64_t>(p2p_chunk, op.bytes - x.moved * p2p_chunk);
          std::memcpy(ch.data, op.data + x.moved * p2p_chunk, n);
          ch.written.store(at + 1, std::memory_order_release);
          ++x.moved;
          progressed = true;
        }
        if (x.moved == x.chunks && ch.read.load(std::memory_order_acquire) >= x.base + x.chunks) {
          x.done = true;
          c->chunks_out[op.peer] = x.base + x.chunks;
          p2p_bytes().sent += static_cast<std::int64_t>(op.bytes);
        }
      } else {
        if (x.moved < x.chunks && ch.written.load(std::memory_order_acquire) > at) {
          const std::uint64_t n = std::min<std::uint64_t>(p2p_chunk, op.bytes - x.moved * p2p_chunk);
          std::memcpy(op.data + x.moved * p2p_chunk, ch.data, n);
          ch.read.store(at + 1, std::memory_order_release);
          ++x.moved;
          progressed = true;
        }
        if (x.moved == x.chunks) {
          x.done = true;
          c->chunks_in[op.peer] = x.base + x.chunks;
          p2p_bytes().received += static_cast<std::int64_t>(op.bytes);
        }
      }
      all = all && x.done;
    }
    if (all) return;
    if (progressed) {
      spins = 0;
      continue;
    }
    const auto now = clock::now();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (st[i].done) continue;
      const RankState& peer = c->seg->rank[ops[i].peer];
      const char* call = ops[i].send ? "ncclSend" : "ncclRecv";
      if (peer.aborted.load(std::memory_order_acquire) != 0) {
        fail(c, ncclRemoteError, "rank " + std::to_string(ops[i].peer) + " aborted its communicator during " + call);
        hang(c, stream);
        return;
      }
      if (now - checked > std::chrono::milliseconds(20) && !alive(peer.pid.load())) {
        fail(c, ncclRemoteError,
             "rank " + std::to_string(ops[i].peer) + " (process " + std::to_string(peer.pid.load()) + ") has exited during " + call);
        hang(c, stream);
        return;
      }
    }
    if (now - checked > std::chrono::milliseconds(20)) checked = now;
    if (now - start > nccl_hang_after()) {  // the peer never posted (or never took the bytes): a send that blocks forever
      hang(c, stream);
      return;
    }
    pause(spins);
  }
}

// Runs or records a group of sends and receives on `stream`.
inline ncclResult_t enqueue_p2p(ncclComm_t comm, std::vector<P2p> ops, cudaStream_t stream) {
  using namespace runtime_detail;
  Comm* c = find<Comm>(comm);
  if (c == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGroupEnd: not a live communicator");
  if (ops.empty()) return ncclSuccess;
  bool record_it = false;
  if (route(stream, record_it) != cudaSuccess) return fail(c, ncclUnhandledCudaError, "ncclSend / ncclRecv: the stream refused it");
  if (!record_it) {
    run_p2p(c, ops, stream);
    return ncclSuccess;
  }
  record(stream, [comm, ops] {
    Comm* live_comm = find<Comm>(comm);
    if (live_comm == nullptr) return cudaErrorInvalidResourceHandle;
    run_p2p(live_comm, ops, replay_stream());
    return cudaSuccess;
  });
  return ncclSuccess;
}

// ncclSend / ncclRecv: checks the call and adds it to the group (a group of its own outside one).
inline ncclResult_t p2p_call(bool send, const void* buf, std::size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  using namespace runtime_detail;
  const char* call = send ? "ncclSend" : "ncclRecv";
  Group& g = group();
  auto refuse = [&](Comm* c, ncclResult_t r, const std::string& why) {
    if (g.depth > 0) g.error = r;
    return fail(c, r, std::string(call) + ": " + why);
  };
  Comm* c = find<Comm>(comm);
  if (c == nullptr) return refuse(nullptr, ncclInvalidArgument, "not a live communicator");
  if (c->async == ncclInProgress) return refuse(c, ncclInvalidUsage, "before the communicator joined");
  const std::size_t e = element_bytes(t);
  if (e == 0) return refuse(c, ncclInvalidArgument, "the emulator has no data type " + std::to_string(t));
  if (peer < 0 || peer >= c->nranks || peer == c->rank)
    return refuse(c, ncclInvalidArgument, "peer " + std::to_string(peer) + " (rank " + std::to_string(c->rank) + " of " + std::to_string(c->nranks) + ")");
  if (is_legacy(stream) || stream == cudaStreamPerThread || find<Stream>(stream) == nullptr)
    return refuse(c, ncclInvalidArgument, "the emulator runs transfers on streams made by cudaStreamCreate*");
  if (count > 0 && !device_accessible(buf, count * e))
    return refuse(c, ncclInvalidArgument, "the buffer (" + std::to_string(count * e) + " bytes) is not inside one live cudaMalloc block");
  const P2p op{send, peer, static_cast<unsigned char*>(const_cast<void*>(buf)), count * e};
  if (g.depth == 0) return count == 0 ? ncclSuccess : enqueue_p2p(comm, {op}, stream);
  if (!g.ops.empty() && (g.comm != comm || g.stream != stream))
    return refuse(c, ncclInvalidUsage, "the emulator groups the sends and receives of one communicator on one stream");
  g.comm = comm, g.stream = stream;
  if (count > 0) g.ops.push_back(op);
  return ncclSuccess;
}

// Joins segment `seg` as `rank` of `nranks` (ncclCommInitRank, and the child of a split).
inline ncclResult_t join(ncclComm_t* comm, Segment* seg, int nranks, int rank, ncclConfig_t* config) {
  std::int32_t expected = 0;
  if (!seg->nranks.compare_exchange_strong(expected, nranks) && expected != nranks)
    return fail(nullptr, ncclInvalidUsage,
                "ncclCommInitRank: " + std::to_string(nranks) + " ranks here, " + std::to_string(expected) + " on a rank that joined before");
  std::int64_t nobody = 0;
  if (!seg->rank[rank].pid.compare_exchange_strong(nobody, static_cast<std::int64_t>(getpid())))
    return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) + " joined twice");
  seg->joined.fetch_add(1);
  runtime_detail::create(comm, Comm{seg, rank, nranks, 0, ncclSuccess, {}, 0, 0});
  Comm* c = runtime_detail::find<Comm>(*comm);
  const bool blocking = config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  if (!blocking) {
    if (seg->joined.load() < nranks) c->async = ncclInProgress;
    return c->async;
  }
  const auto start = std::chrono::steady_clock::now();
  int spins = 0;
  while (seg->joined.load() < nranks) {
    if (std::chrono::steady_clock::now() - start > nccl_hang_after())
      return fail(c, ncclSystemError, "ncclCommInitRank: the other ranks did not join (the emulator's wait ended)");
    pause(spins);
  }
  return ncclSuccess;
}

}  // namespace nccl_detail
}  // namespace headroom::cuda_emulator

// ---------------------------------------------------------------------------
// The NCCL API (nccl.h)
// ---------------------------------------------------------------------------

inline ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

inline const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

inline const char* ncclGetLastError(ncclComm_t comm) {
  using namespace headroom::cuda_emulator;
  const nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  return c != nullptr ? c->last_error.c_str() : nccl_detail::global_last_error().c_str();
}

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  using namespace headroom::cuda_emulator::nccl_detail;
  if (uniqueId == nullptr) return ncclInvalidArgument;
  // the id's segment and the pool of its communicators' children (pages are touched only when used)
  void* p = mmap(nullptr, sizeof(Segment) * pool_segments, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail(nullptr, ncclSystemError, "ncclGetUniqueId: mmap of the shared segment failed");
  auto* seg = static_cast<Segment*>(p);  // zero-filled: no rank joined, nothing posted, no child taken
  for (int i = 0; i < pool_segments; ++i) {
    seg[i].magic = id_magic;
    seg[i].pool = seg;
  }
  std::memset(uniqueId, 0, sizeof *uniqueId);
  std::memcpy(uniqueId->internal, &id_magic, sizeof id_magic);
  std::memcpy(uniqueId->internal + sizeof id_magic, &seg, sizeof seg);
  return ncclSuccess;
}

inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  using namespace headroom::cuda_emulator;
  using namespace headroom::cuda_emulator::nccl_detail;
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  std::uint64_t magic = 0;
  Segment* seg = nullptr;
  std::memcpy(&magic, commId.internal, sizeof magic);
  std::memcpy(&seg, commId.internal + sizeof magic, sizeof seg);
  if (magic != id_magic || seg == nullptr || seg->magic != id_magic)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: not an id of ncclGetUniqueId (in this process or the one it forked from)");
  if (nranks < 1 || nranks > max_ranks || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " (the emulator has 1 to 8 ranks)");
  return join(comm, seg, nranks, rank, config);
}

inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  using namespace headroom::cuda_emulator;
  nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  if (c == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  if (c->async == ncclInProgress && c->seg->joined.load() >= c->nranks && c->hung == 0) c->async = ncclSuccess;
  *asyncError = c->async;
  return ncclSuccess;
}

inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  using namespace headroom::cuda_emulator;
  const nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  if (c == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  using namespace headroom::cuda_emulator;
  const nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  if (c == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

// Ends the communicator at once: its hung work is released (a GPU's NCCL
// kernels return) and the other ranks' collectives fail (ncclRemoteError).
inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
  using namespace headroom::cuda_emulator;
  nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  if (c == nullptr) return ncclInvalidArgument;
  c->seg->rank[c->rank].aborted.store(1, std::memory_order_release);
  if (c->hung != 0) runtime_detail::hung_work().erase(c->hung);
  runtime_detail::destroy<nccl_detail::Comm>(comm);
  return ncclSuccess;
}

// Completes the communicator's work: in progress while some of it is hung.
inline ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  using namespace headroom::cuda_emulator;
  nccl_detail::Comm* c = runtime_detail::find<nccl_detail::Comm>(comm);
  if (c == nullptr) return ncclInvalidArgument;
  if (c->hung != 0) c->async = ncclInProgress;
  return c->async;
}

inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  using namespace headroom::cuda_emulator;
  return runtime_detail::destroy<nccl_detail::Comm>(comm) ? ncclSuccess : ncclInvalidArgument;
}

inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::nccl_detail;
  return enqueue(comm, Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, stream);
}

inline ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                                      ncclComm_t comm, cudaStream_t stream) {
  using namespace headroom::cuda_emulator::nccl_detail;
  return enqueue(comm, Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, stream);
}

inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                                  cudaStream_t stream) {
  using namespace headroom::cuda_emulator::nccl_detail;
  return enqueue(comm, Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, stream);
}

inline ncclResult_t ncclGroupStart() {
  using namespace headroom::cuda_emulator::nccl_detail;
  Group& g = group();
  if (g.depth++ == 0) g = Group{1, nullptr, nullptr, {}, ncclSuccess};
  return ncclSuccess;
}

// The group's sends and receives run together now (or are recorded into the stream's capture).
inline ncclResult_t ncclGroupEnd() {
  using namespace headroom::cuda_emulator::nccl_detail;
  Group& g = group();
  if (g.depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  Group done = std::move(g);
  g = Group{};
  if (done.error != ncclSuccess) return done.error;
  return done.ops.empty() ? ncclSuccess : enqueue_p2p(done.comm, std::move(done.ops), done.stream);
}

inline ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return headroom::cuda_emulator::nccl_detail::p2p_call(true, sendbuff, count, datatype, peer, comm, stream);
}

inline ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return headroom::cuda_emulator::nccl_detail::p2p_call(false, recvbuff, count, datatype, peer, comm, stream);
}

inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  using namespace headroom::cuda_emulator;
  using namespace headroom::cuda_emulator::nccl_detail;
  Comm* c = runtime_detail::find<Comm>(comm);
  if (c == nullptr || newcomm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  *newcomm = nullptr;
  if (c->async == ncclInProgress) return fail(c, ncclInvalidUsage, "ncclCommSplit before the communicator joined");
  if (c->splits >= max_splits)
    return fail(c, ncclInvalidUsage, "ncclCommSplit: the emulator splits a communicator at most " + std::to_string(max_splits) + " times");
  const int s = c->splits++;
  SplitPost* posts = c->seg->split[s];
  posts[c->rank].color = color;
  posts[c->rank].key = key;
  posts[c->rank].posted.store(1, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  int spins = 0;
  for (int q = 0; q < c->nranks; ++q)
    while (posts[q].posted.load(std::memory_order_acquire) == 0) {
      if (std::chrono::steady_clock::now() - start > nccl_hang_after())
        return fail(c, ncclSystemError, "ncclCommSplit: rank " + std::to_string(q) + " did not split (the emulator's wait ended)");
      pause(spins);
    }
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  // the group: the ranks of this color, by (key, parent rank); its lowest parent rank takes its segment from the pool
  int lowest = -1, size = 0, rank = 0;
  for (int q = 0; q < c->nranks; ++q) {
    if (posts[q].color != color) continue;
    if (lowest < 0) lowest = q;
    ++size;
    if (posts[q].key < key || (posts[q].key == key && q < c->rank)) ++rank;
  }
  Segment* pool = c->seg->pool;
  std::atomic<std::int32_t>& child = posts[lowest].child;
  if (lowest == c->rank) {
    const std::int32_t taken = pool->children.fetch_add(1);
    child.store(1 + taken < pool_segments ? 1 + taken : no_child, std::memory_order_release);
  }
  std::int32_t at = 0;
  while ((at = child.load(std::memory_order_acquire)) == 0) {
    if (std::chrono::steady_clock::now() - start > nccl_hang_after())
      return fail(c, ncclSystemError, "ncclCommSplit: rank " + std::to_string(lowest) + " did not make its group (the emulator's wait ended)");
    pause(spins);
  }
  if (at == no_child)
    return fail(c, ncclInternalError,
                "ncclCommSplit: the emulator's " + std::to_string(pool_segments - 1) + " segments for the groups split from this id are all taken");
  return join(newcomm, pool + at, size, rank, config);
}
