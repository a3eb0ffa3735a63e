#pragma once
// cuda::OpContext<S>: what an op's CUDA kernels see of one event: its operands
// by name (ops::Bound<S>, device pointers) and the engine's compute stream,
// cuBLASLt handle and the step's control block.
//
//   template <class S>
//   static void forward(const cuda::OpContext<S>& k) {     // in an op type (ops/op.hpp)
//     gelu_forward<S>(k[x], k[y], k.rows() * k[features], k.stream());
//   }
//
// Statistics (norm rstd, attention lse) are f32 whatever S is: read them with
// k.get<float>(operand). A kernel enqueues work on k.stream() only; the
// engine orders that stream with its copies and with other lanes (an op on
// the communication lane gets the communication stream as k.stream(), and a
// data-parallel run's communicator as k.comm; a pipeline stage's transfers
// go through k.pipe).
#include <cuda_runtime_api.h>

#include "../graph/bound.hpp"
#include "blas.cuh"
#include "communicator.cuh"
#include "kernels/optimizer.cuh"
#include "pipe_exchange.cuh"

namespace headroom::cuda {

template <class S>
struct OpContext : ops::Bound<S> {
  static constexpr const char* engine = "CUDA";
  cudaStream_t compute = nullptr;
  Blas* cublas = nullptr;
  UpdateControl* control_block = nullptr;
  float* loss_sum = nullptr;  // the step's loss slot (f32, device)
  Communicator* comm = nullptr;  // data parallelism: the ranks' communicator (the collectives' kernels)
  Communicator* tensor_comm = nullptr;  // tensor parallelism: this rank's group (its collectives run on the compute stream)
  PipeExchange* pipe = nullptr;         // pipeline parallelism: the transfers with the stages before and after (compute stream)
  int schedule_step = -1;  // this event's step in the trainer's schedule (a kernel that stops the step records it in the control block)

  cudaStream_t stream() const { return compute; }
  Blas& blas() const { return *cublas; }
  UpdateControl* control() const { return control_block; }
  float* loss() const { return loss_sum; }
  template <class O>
  const OpContext* fused() const {
    return this->next_ != nullptr && this->next_op_ == O::name ? static_cast<const OpContext*>(this->next_) : nullptr;
  }
};

}  // namespace headroom::cuda
