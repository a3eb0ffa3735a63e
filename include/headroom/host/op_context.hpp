#pragma once
// host::OpContext<T>: what an op's host kernels see of one event: its operands
// by name (ops::Bound<T>) and the engine's worker threads and GEMM panels.
//
//   template <class T>
//   static void forward(const host::OpContext<T>& k) {     // in an op type (ops/op.hpp)
//     gelu_forward(k[x], k[y], k.rows() * k[features], k.workers());
//   }
//
// host::Trainer builds one per event of a training step, host::Generator one
// per op of a decode step.
#include "../graph/bound.hpp"
#include "communicator.hpp"
#include "panels.hpp"
#include "storage.hpp"

namespace headroom::host {

// T is the storage type (host/storage.hpp); statistics (norm rstd, attention
// lse), the loss scratch and the GEMM panels are in compute (compute_t<T>):
// read those with k.get<typename OpContext<T>::compute>(operand).
template <class T>
struct OpContext : ops::Bound<T> {
  using compute = compute_t<T>;
  static constexpr const char* engine = "host";
  int n_workers = 1;
  GemmPanels<compute> gemm_panels{};
  Communicator* comm = nullptr;         // data parallelism: the ranks' communicator (the collectives' kernels)
  Communicator* tensor_comm = nullptr;  // tensor parallelism: this rank's tensor-parallel group (ops/tensor_parallel.hpp)
  Communicator* pipe_comm = nullptr;    // pipeline parallelism: this rank's stages, ranked by stage (ops/pipeline.hpp)

  int workers() const { return n_workers; }
  const GemmPanels<compute>& panels() const { return gemm_panels; }
  // The next event when it runs in this op's epilogue and is an O; else null.
  template <class O>
  const OpContext* fused() const {
    return this->next_ != nullptr && this->next_op_ == O::name ? static_cast<const OpContext*>(this->next_) : nullptr;
  }
};

}  // namespace headroom::host
