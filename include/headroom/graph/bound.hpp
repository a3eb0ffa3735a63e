#pragma once
// ops::Bound<T>: an op's operands as one event binds them, by name.
//
// Each engine derives its kernel context from it (host::OpContext<T>,
// cuda::OpContext<S>), adding what its kernels run with (worker threads and
// GEMM panels; a stream and cuBLASLt). The engine resolves every operand of
// the event to a pointer before the kernel runs, so a kernel reads its
// operands by the names its op type gave them (k[x], k.grad(x)) and never
// sees offsets, slots or the schedule. Pointers are null where an operand
// is not bound (an input whose gradient nobody needs, a frozen parameter's
// gradient, a missing bias).
#include <cstdint>
#include <string_view>

#include "../math/quant_view.hpp"
#include "graph.hpp"
#include "operands.hpp"
#include "roles.hpp"

namespace headroom::ops {

template <class T>
struct Bound {
  using scalar = T;

  // ---- the event ------------------------------------------------------------------------------------
  EventKind event = EventKind::forward;  // forward, recompute, loss or backward
  std::int64_t dims[graph::max_dims]{};
  std::int64_t n_rows = 0;               // tokens of the micro-batch (decode: the batch)
  std::int64_t n_batch = 1, n_seq = 1;   // sequences and tokens per sequence
  std::int64_t first_position = 0;       // decode: the position of the rows' token
  std::int64_t context_length = 0;       // decode: the positions the op's state holds
  int accumulated = 1;                   // micro-batches per optimizer step
  int micro = 0;                         // this micro-batch of the step, 0 .. accumulated - 1
  int node = -1, instance = 0;           // the op's place in the model: its node and Repeat instance
  int tensor_rank = 0, tensor_ranks = 1; // tensor parallelism: this rank's place in its group, and its size
  // Dropout masks (math/dropout.hpp) derive from the run's seed, the step and
  // the data-parallel rank. step: the training step in progress, 0 outside
  // training (evaluation, decoding: nothing is dropped). The CUDA engine reads
  // the step from its control block on the device instead (a captured step
  // replays with the next step's number).
  std::uint64_t seed = 0;
  int step = 0;
  int data_rank = 0;
  // Loss scaling (train/loss_scaling.hpp): the loss's gradient is multiplied
  // by it (host; the CUDA engine reads UpdateControl::loss_scale on the device).
  float loss_scale = 1.0f;

  // ---- operands, resolved -----------------------------------------------------------------------------
  void* in_[graph::max_in]{};
  void* out_[graph::max_out]{};
  bool out_first_[graph::max_out]{};
  void* inout_ = nullptr;
  void* saved_[graph::max_saved]{};
  void* d_in_[graph::max_in]{};
  bool d_in_first_[graph::max_in]{};
  void* d_out_[graph::max_out]{};
  void* d_inout_ = nullptr;
  void* scratch_ = nullptr;
  std::int64_t scratch_bytes_ = 0;
  T* weight_[graph::max_weights]{};        // dense parameters (null when quantized)
  math::QuantView quant_[graph::max_weights]{};
  bool quantized_[graph::max_weights]{};
  T* weight_grad_[graph::max_weights]{};
  bool weight_grad_first_[graph::max_weights]{};
  void* state_ = nullptr;                  // decode: the op's state across tokens (attention's KV cache)
  const Bound* next_ = nullptr;            // the next event, when it runs in this op's epilogue (fused)
  std::string_view next_op_{};

  // ---- operand access by name ---------------------------------------------------------------------------
  template <class U = T, int I>
  U* get(ops::In<I>) const { return static_cast<U*>(in_[I]); }
  template <class U = T, int I>
  U* get(ops::Out<I>) const { return static_cast<U*>(out_[I]); }
  template <class U = T>
  U* get(ops::InOut) const { return static_cast<U*>(inout_); }
  template <class U = T, int I>
  U* get(ops::Saved<I>) const { return static_cast<U*>(saved_[I]); }
  template <int I>
  T* operator[](ops::In<I> t) const { return get(t); }
  template <int I>
  T* operator[](ops::Out<I> t) const { return get(t); }
  T* operator[](ops::InOut t) const { return get(t); }
  template <int I>
  T* operator[](ops::Saved<I> t) const { return get(t); }
  template <int I>
  std::int64_t operator[](ops::Dim<I>) const { return dims[I]; }
  template <int I>
  T* operator[](ops::Weight<I>) const { return weight_[I]; }

  // Gradients: of an input (written by backward), of an output or of the
  // tensor updated in place (read by backward), of a parameter (null when
  // frozen). first(): this event writes that gradient first (overwrite it;
  // accumulate otherwise).
  template <int I>
  T* grad(ops::In<I>) const { return static_cast<T*>(d_in_[I]); }
  template <int I>
  T* grad(ops::Out<I>) const { return static_cast<T*>(d_out_[I]); }
  T* grad(ops::InOut) const { return static_cast<T*>(d_inout_); }
  template <int I>
  T* grad(ops::Weight<I>) const { return weight_grad_[I]; }
  template <int I>
  bool first(ops::In<I>) const { return d_in_first_[I]; }
  template <int I>
  bool first(ops::Weight<I>) const { return weight_grad_first_[I]; }
  template <int I>
  bool first(ops::Out<I>) const { return out_first_[I]; }

  template <int I>
  bool quantized(ops::Weight<I>) const { return quantized_[I]; }
  template <int I>
  const math::QuantView& quant(ops::Weight<I>) const { return quant_[I]; }

  template <class U = T>
  U* scratch() const { return static_cast<U*>(scratch_); }
  std::int64_t scratch_bytes() const { return scratch_bytes_; }
  template <class U>
  U* state() const { return static_cast<U*>(state_); }

  // ---- the run -----------------------------------------------------------------------------------------
  std::int64_t rows() const { return n_rows; }
  std::int64_t batch() const { return n_batch; }
  std::int64_t seq() const { return n_seq; }
  std::int64_t position() const { return first_position; }
  std::int64_t context() const { return context_length; }
  int accumulate() const { return accumulated; }
  int micro_batch() const { return micro; }
  bool training() const { return step != 0; }
};

}  // namespace headroom::ops
