#pragma once
// The point-to-point transfers of pipeline parallelism, as ops the model's
// Repeat emits for a run with PipelineParallel<S> (layers/repeat.hpp): a
// stage holds a contiguous share of the blocks; activations go forward from
// stage s to s + 1, their gradients back.
//
//   pipe_recv  first op of every stage but the first: forward receives the
//              stage's input (N, features) from the stage before; backward
//              sends that input's gradient back to it.
//   pipe_send  last op of every stage but the last: forward starts sending
//              the stage's output to the next stage (keeping it until its
//              backward: it is saved); backward receives the output's
//              gradient from there, then completes that send.
//
// A send that completes only in the backward (Communicator::begin_send) is
// what keeps 1F1B free of deadlock: a stage never waits for the next one to
// take its activation before it receives a gradient from it.
// Peers are ranks of the pipeline group (host::OpContext::pipe_comm), which
// is ordered by stage. Tags: 0 activations, 1 gradients.
//
// The CUDA kernels go through cuda::PipeExchange (cuda::OpContext::pipe):
// NCCL's sends block until the peer posts the receive, so a send waits there
// for the stage's next receive from the same peer and both go in one group
// (cuda/pipe_exchange.cuh says why that order cannot deadlock).
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "../host/communicator.hpp"
#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

namespace pipe_detail {
inline constexpr int activation_tag = 0, gradient_tag = 1;
template <class T>
std::int64_t bytes(const host::OpContext<T>& k, std::int64_t features) {
  return k.rows() * features * static_cast<std::int64_t>(sizeof(T));
}
#if HEADROOM_CUDA_KERNELS
template <class S>
std::int64_t bytes(const cuda::OpContext<S>& k, std::int64_t features) {
  return k.rows() * features * static_cast<std::int64_t>(sizeof(S));
}
#endif
}  // namespace pipe_detail

struct PipelineRecv {
  static constexpr std::string_view name = "pipe_recv";
  static constexpr Out<0> x{};  // (N, features): this stage's input
  static constexpr Dim<0> features{};

  static constexpr graph::Ref emit(graph::Builder& b, std::int64_t d) {
    graph::Op op = make<PipelineRecv>();
    op.set(features, d);
    const graph::Ref out = b.activation("received", d);  // (N, D)
    op.output(x, out);
    op.exchange_fwd = graph::Exchange{.received = b.act(d)};
    op.exchange_bwd = graph::Exchange{.sent = b.act(d)};
    b.emit(op);
    return out;
  }
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    k.pipe_comm->recv(k[x], pipe_detail::bytes(k, k[features]), k.pipe_comm->rank() - 1, pipe_detail::activation_tag);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    if (const T* dx = k.grad(x))
      k.pipe_comm->send(dx, pipe_detail::bytes(k, k[features]), k.pipe_comm->rank() - 1, pipe_detail::gradient_tag);
  }
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    k.pipe->receive(k[x], pipe_detail::bytes(k, k[features]), k.pipe->rank() - 1, k.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    if (const S* dx = k.grad(x)) k.pipe->send(dx, pipe_detail::bytes(k, k[features]), k.pipe->rank() - 1);
  }
#endif
};

struct PipelineSend {
  static constexpr std::string_view name = "pipe_send";
  static constexpr In<0> x{};        // (N, features): this stage's output
  static constexpr Saved<0> kept{};  // the same bytes, alive until the send completes (backward)
  static constexpr Dim<0> features{};

  static constexpr void emit(graph::Builder& b, graph::Ref output, std::int64_t d) {
    graph::Op op = make<PipelineSend>();
    op.set(features, d);
    op.input(x, output);
    op.save(kept, output);
    op.exchange_fwd = graph::Exchange{.sent = b.act(d)};
    op.exchange_bwd = graph::Exchange{.received = b.act(d)};
    b.emit(op);
  }
  template <class T>
  static void forward(const host::OpContext<T>& k) {
    k.pipe_comm->begin_send(k[x], pipe_detail::bytes(k, k[features]), k.pipe_comm->rank() + 1, pipe_detail::activation_tag);
  }
  template <class T>
  static void backward(const host::OpContext<T>& k) {
    T* dx = k.grad(x);
    if (dx == nullptr || !k.first(x))
      throw std::logic_error("pipe_send: the stage's output has another reader; its gradient must come from the next stage alone");
    k.pipe_comm->recv(dx, pipe_detail::bytes(k, k[features]), k.pipe_comm->rank() + 1, pipe_detail::gradient_tag);
    k.pipe_comm->finish_send(k.pipe_comm->rank() + 1, pipe_detail::activation_tag);
  }
#if HEADROOM_CUDA_KERNELS
  // forward: the output waits to go with the next receive from the next
  // stage (its gradient); it is saved, so its bytes stay until then
  template <class S>
  static void forward(const cuda::OpContext<S>& k) {
    k.pipe->send(k[x], pipe_detail::bytes(k, k[features]), k.pipe->rank() + 1);
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& k) {
    S* dx = k.grad(x);
    if (dx == nullptr || !k.first(x))
      throw std::logic_error("pipe_send: the stage's output has another reader; its gradient must come from the next stage alone");
    k.pipe->receive(dx, pipe_detail::bytes(k, k[features]), k.pipe->rank() + 1, k.stream());
  }
#endif
};

}  // namespace headroom::ops
