#pragma once
// The collectives the host engine calls for data-parallel (and pipelined)
// training, as an abstract interface: the engine sees a Communicator, and
// only a distributed program includes an implementation that talks to a
// transport (host/mpi.hpp: MpiCommunicator over MPI_COMM_WORLD).
//
// Every rank of a job calls the same collectives in the same order with the
// same sizes; a call returns when this rank's part of it is done (its buffers
// may be read and reused). Collectives are issued from one thread at a time:
// the engine's communication lane thread, or the caller's.
//
// Sizes are 64-bit. Element counts (and byte counts) may exceed INT_MAX, which
// is all a single MPI call can carry: an implementation splits such calls into
// chunks, and the result is the same as one call would give.
//
// Errors:
//  * communication_error is thrown on every surviving rank when a call cannot
//    complete: another rank died, hangs (the call did not complete within the
//    implementation's timeout), the transport reported an error, or the ranks
//    disagree (agree(), check_size()). Its what() is one sentence that starts
//    with "rank R of N:" and names the call and its size. After a
//    communication_error from a collective or a point-to-point call, the
//    communicator is unusable: every later call throws at once, the buffers
//    of the failed call may still be written by the transport, and the job
//    has to end (the launcher stops the other ranks when this one exits).
//    agree() and check_size() leave the communicator usable: every rank
//    throws the same error, nothing is left in flight.
//  * std::invalid_argument for a call that is wrong on its face (a negative
//    count, a dtype other than F32 / F64, a peer outside [0, size())), thrown
//    before anything is sent.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "headroom/core/dtype.hpp"

namespace headroom::host {

// The element type of a host engine's values in a collective (f32, or f64 in f64 runs).
template <class T>
inline constexpr DType dtype_of = sizeof(T) == 8 ? DType::F64 : DType::F32;

namespace comm_detail {
// Joins the parts of a message (appending, which g++ 12 -O3 does not
// misread under -Wrestrict as it does "text" + std::string&&).
inline std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}
}  // namespace comm_detail

// Thrown on every surviving rank when a collective cannot complete: a rank died, hangs, or the job is inconsistent.
struct communication_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's index in the job, 0 .. size() - 1, and the number of processes.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sum over ranks, in place: n elements of type t (DType::F32 or DType::F64).
  // Afterwards every rank holds the same sums.
  virtual void all_reduce_sum(void* data, std::int64_t n, DType t) = 0;

  // send holds size() blocks of n elements; recv (n elements, not overlapping send) receives the sum over ranks of block rank().
  // (ZeRO's gradient shard: rank r ends with the reduced r-th slice.)
  virtual void reduce_scatter_sum(const void* send, void* recv, std::int64_t n, DType t) = 0;

  // In place: data holds size() blocks of block_bytes bytes; block rank() is this rank's; afterwards every block is its owner's.
  // (ZeRO's parameter gather: every rank contributes its shard and ends with all of them.)
  virtual void all_gather(void* data, std::int64_t block_bytes) = 0;

  // Point to point (for pipeline stages): bytes to / from rank `peer`, matched by tag.
  // A send returns when its buffer may be reused, a recv when the bytes have
  // arrived; sends to one peer with one tag arrive in the order they were
  // sent. Tags are >= 0 (an implementation may have an upper bound: MPI's is
  // at least 32767).
  virtual void send(const void* data, std::int64_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, std::int64_t bytes, int peer, int tag) = 0;
  // A send that may still be in flight when it returns (the buffer must stay
  // as it is), and the completion of the oldest such send to `peer` with
  // `tag` (sends to one peer and tag complete in the order begun). Pipeline
  // stages send activations this way and complete the send when the
  // gradient comes back, so that no two stages wait on each other's sends.
  // By default the send completes at once (a blocking send).
  virtual void begin_send(const void* data, std::int64_t bytes, int peer, int tag) { send(data, bytes, peer, tag); }
  virtual void finish_send(int /*peer*/, int /*tag*/) {}

  // Returns when every rank has entered it.
  virtual void barrier() = 0;

  // A collective: the ranks that pass the same color form a new
  // communicator, ranked by key (ties by this one's rank). Used to divide
  // the processes of a run into its data- and tensor-parallel groups.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // "rank R of N": the start of every error message.
  std::string who() const { return comm_detail::cat({"rank ", std::to_string(rank()), " of ", std::to_string(size())}); }

  // Every rank passes a value (a hash of the plan, so that all ranks were
  // built from the same run type); returns it when all are equal, else throws
  // communication_error on every rank naming which ranks hold which value.
  // `what` names the value in the message.
  std::uint64_t agree(std::uint64_t value, std::string_view what = "the run type's hash") {
    const int n = size();
    std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
    all[static_cast<std::size_t>(rank())] = value;
    all_gather(all.data(), sizeof(std::uint64_t));
    bool same = true;
    for (std::uint64_t v : all) same = same && v == all[0];
    if (same) return value;
    // value -> ranks holding it, in order of first appearance
    std::vector<std::uint64_t> order;
    std::map<std::uint64_t, std::vector<int>> holders;
    for (int r = 0; r < n; ++r) {
      std::uint64_t v = all[static_cast<std::size_t>(r)];
      if (holders.find(v) == holders.end()) order.push_back(v);
      holders[v].push_back(r);
    }
    std::string msg = comm_detail::cat({who(), ": the ranks disagree on ", what, ": "});
    for (std::size_t i = 0; i < order.size(); ++i) {
      const std::vector<int>& rs = holders[order[i]];
      if (i) msg += "; ";
      msg += hex(order[i]);
      msg += rs.size() == 1 ? " on rank " : " on ranks ";
      for (std::size_t j = 0; j < rs.size(); ++j) {
        if (j) msg += ", ";
        msg += std::to_string(rs[j]);
      }
    }
    msg += " (were all ranks built from the same program?)";
    throw communication_error(msg);
  }

  // Throws communication_error, on every rank, unless the job has `expected`
  // processes. `what` names them: "data-parallel ranks".
  void check_size(int expected, std::string_view what = "ranks") const {
    const int n = size();
    if (n == expected) return;
    const std::string count = std::to_string(n);
    throw communication_error(comm_detail::cat({who(), ": the run type says ", std::to_string(expected), " ", what,
                                                ", but the launcher started ", count, n == 1 ? " process" : " processes",
                                                " (mpirun -np ", count, ")"}));
  }

 protected:
  static std::string hex(std::uint64_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x0000000000000000";
    for (int i = 17; i >= 2; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
    return s;
  }
};

}  // namespace headroom::host
