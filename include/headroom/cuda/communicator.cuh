#pragma once
// cuda::Communicator: the collectives the CUDA engine calls for data- and
// tensor-parallel training (split() makes a group's communicator) and the
// point-to-point transfers of pipeline parallelism (send_recv), on device memory and enqueued on a stream, as an abstract
// interface. The engine sees a Communicator; only a distributed program
// includes an implementation that talks to a transport (cuda/nccl.cuh:
// NcclCommunicator over NCCL, one GPU per rank).
//
// Every rank of a job calls the same collectives in the same order with the
// same sizes. A call enqueues the collective on `stream` and returns at once
// (as a kernel launch does): its buffers are done with when the stream's
// work up to it is, and work enqueued after it on that stream (or on a
// stream waiting for an event recorded after it) sees its result. Calls may
// be captured into a CUDA graph.
//
// Waiting: synchronize(stream) is the only place the host waits for the
// ranks. It returns once everything enqueued on the stream so far is done,
// and throws communication_error (host/communicator.hpp) when a collective
// cannot complete: the transport reported an error, or the work did not
// finish within the implementation's timeout (another rank stopped or hangs).
// Its what() is one sentence that starts with "rank R of N:" and names the
// collective and its size. After it the communicator is unusable: every
// later call throws at once, and the job has to end.
//
// std::invalid_argument for a call that is wrong on its face (a negative
// count, a dtype other than F32 / BF16 / F16 / F64), before anything is
// enqueued.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../core/dtype.hpp"
#include "../host/communicator.hpp"  // communication_error, comm_detail::cat

namespace headroom::cuda {

using host::communication_error;

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's index in the job, 0 .. size() - 1, and the number of processes.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sum over ranks, in place: n elements of type t.
  virtual void all_reduce_sum(void* data, std::int64_t n, DType t, cudaStream_t stream) = 0;
  // send holds size() blocks of n elements; recv (n elements, not overlapping
  // send) receives the sum over ranks of block rank() (ZeRO's gradient shard).
  virtual void reduce_scatter_sum(const void* send, void* recv, std::int64_t n, DType t, cudaStream_t stream) = 0;
  // recv holds size() blocks of block_bytes bytes; block r receives rank r's
  // `send` (ZeRO's parameter gather). send may be recv's own block (in place).
  virtual void all_gather(const void* send, void* recv, std::int64_t block_bytes, cudaStream_t stream) = 0;

  // Point to point (pipeline parallelism): sends send_bytes bytes to rank
  // `to` and receives recv_bytes bytes from rank `from`, as one group whose
  // two transfers progress together (to < 0: no send; from < 0: no receive).
  // A send completes only once its peer has posted the matching receive
  // (NCCL's ncclSend "is blocking for the GPU"), so two ranks that send to
  // each other must each pair that send with the receive in one call; the
  // peer's matching call has the same sizes. Transfers between two ranks
  // match in the order they are called. Not a collective: only the peers
  // call it.
  virtual void send_recv(const void* send, std::int64_t send_bytes, int to, void* recv, std::int64_t recv_bytes, int from,
                         cudaStream_t stream) = 0;

  // A group of this communicator's ranks (a collective of every rank):
  // the ranks that pass the same color, ranked by key (ties by rank here).
  // Tensor parallelism splits the world into its groups this way. The group
  // has its own collectives and its own bounded wait.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Returns when everything enqueued on `stream` so far has finished, or
  // throws communication_error (see above). `what` names the work waited
  // for in a message where no collective can be named ("step 3").
  virtual void synchronize(cudaStream_t stream, std::string_view what) = 0;

  // "rank R of N": the start of every error message.
  std::string who() const { return host::comm_detail::cat({"rank ", std::to_string(rank()), " of ", std::to_string(size())}); }

  // Every rank passes a value (the run type's schedule hash, the seed);
  // returns it when all are equal, else throws communication_error on every
  // rank naming each rank's value. `what` names the value in the message.
  std::uint64_t agree(std::uint64_t value, std::string_view what) {
    const std::vector<std::uint64_t> all = gather_values(value);
    bool same = true;
    for (std::uint64_t v : all) same = same && v == value;
    if (same) return value;
    std::string msg = host::comm_detail::cat({who(), ": the ranks disagree on ", what, ":"});
    for (std::size_t r = 0; r < all.size(); ++r)
      msg += host::comm_detail::cat({r == 0 ? " rank " : ", rank ", std::to_string(r), " has ", std::to_string(all[r])});
    throw communication_error(msg + " (were all ranks built from the same program and given the same options?)");
  }

  // Every rank's block_bytes bytes of host memory, by rank: `data` holds
  // size() blocks and this rank's own is block rank() (a collective; waits
  // for it, bounded). For what the host exchanges outside a step (a
  // checkpoint's file names, sizes and errors): eight bytes a round.
  void all_gather_on_host(void* data, std::int64_t block_bytes) {
    auto* bytes = static_cast<unsigned char*>(data);
    const std::size_t block = static_cast<std::size_t>(block_bytes);
    for (std::size_t at = 0; at < block; at += sizeof(std::uint64_t)) {
      const std::size_t n = std::min(sizeof(std::uint64_t), block - at);
      std::uint64_t mine = 0;
      std::memcpy(&mine, bytes + static_cast<std::size_t>(rank()) * block + at, n);
      const std::vector<std::uint64_t> all = gather_values(mine);
      for (std::size_t r = 0; r < all.size(); ++r) std::memcpy(bytes + r * block + at, &all[r], n);
    }
  }

  // Throws communication_error unless the job has `expected` ranks.
  void check_size(int expected, std::string_view what) const {
    if (size() == expected) return;
    throw communication_error(host::comm_detail::cat({who(), ": the run type says ", std::to_string(expected), " ", what,
                                                      ", but the communicator joins ", std::to_string(size()),
                                                      size() == 1 ? " rank" : " ranks"}));
  }

 protected:
  // Every rank's `value`, by rank (a collective; waits for it, bounded).
  virtual std::vector<std::uint64_t> gather_values(std::uint64_t value) = 0;
};

}  // namespace headroom::cuda
