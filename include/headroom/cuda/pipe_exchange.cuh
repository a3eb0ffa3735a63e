#pragma once
// cuda::PipeExchange: a pipeline stage's transfers with its neighbours, in
// the order NCCL's blocking point-to-point calls need.
//
// ncclSend is "blocking for the GPU" (nccl.h): it completes only once the
// peer has posted the matching ncclRecv. Under 1F1B a stage sends its
// output forward while the next stage sends a gradient back; two sends in
// opposite directions, each alone, wait for each other forever. The
// transfers are therefore paired as Megatron-LM pairs them
// (send_forward_recv_backward, send_backward_recv_forward):
//
//   send(...)     a send the op asks for (pipe_send forward: the stage's
//                 output; pipe_recv backward: its input's gradient) is not
//                 issued at once: it waits, holding only the pointer;
//   receive(...)  the stage's next receive (pipe_recv forward, pipe_send
//                 backward) takes it along when it is from the same peer:
//                 one group (Communicator::send_recv: ncclGroupStart, ncclSend,
//                 ncclRecv, ncclGroupEnd), in which both complete while the
//                 peer does the same; from another peer, the send goes alone
//                 first, then the receive;
//   flush(...)    the trainer issues a waiting send alone where the next
//                 micro-batch's work on this stage starts with no receive
//                 (the first stage's forward, the last stage's backward),
//                 and at the end of the step.
//
// On every stage the sends and receives then match in an order that
// completes: tests/cuda/data_parallel/pipeline_parallel.cpp enumerates 2 to
// 8 stages and 1 to 16 micro-batches under NCCL's blocking semantic, where
// the same sends and receives unpaired deadlock from 2 micro-batches on. A send
// waits with no work between it and its receive (both are at the seam
// between two micro-batches' work), so its bytes are unchanged when it goes.
// Everything is enqueued on the compute stream: the next kernel needs the
// received bytes, and NCCL's calls of one communicator stay in one order.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>

#include "communicator.cuh"

namespace headroom::cuda {

class PipeExchange {
 public:
  PipeExchange() = default;
  explicit PipeExchange(Communicator* pipe) : comm_(pipe) {}

  // This process's stage (its rank in the stages' communicator, ranked by stage).
  int rank() const { return comm_->rank(); }

  // A send of `bytes` to stage `peer`, issued with the next receive or flush.
  void send(const void* data, std::int64_t bytes, int peer) {
    if (waiting_.data != nullptr)
      throw std::logic_error("cuda::PipeExchange: a second send before the first was issued (a receive or flush comes between)");
    waiting_ = Waiting{data, bytes, peer};
  }
  // Receives `bytes` from stage `peer` into data, with the waiting send when it goes to the same peer.
  void receive(void* data, std::int64_t bytes, int peer, cudaStream_t stream) {
    if (waiting_.data != nullptr && waiting_.peer == peer) {
      comm_->send_recv(waiting_.data, waiting_.bytes, peer, data, bytes, peer, stream);
      waiting_ = Waiting{};
      return;
    }
    flush(stream);
    comm_->send_recv(nullptr, 0, -1, data, bytes, peer, stream);
  }
  // Issues the waiting send, alone.
  void flush(cudaStream_t stream) {
    if (waiting_.data == nullptr) return;
    const Waiting w = waiting_;
    waiting_ = Waiting{};
    comm_->send_recv(w.data, w.bytes, w.peer, nullptr, 0, -1, stream);
  }
  bool waiting() const { return waiting_.data != nullptr; }

 private:
  struct Waiting {
    const void* data = nullptr;
    std::int64_t bytes = 0;
    int peer = -1;
  };
  Communicator* comm_ = nullptr;
  Waiting waiting_{};
};

}  // namespace headroom::cuda
