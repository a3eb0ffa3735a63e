#pragma once
// What the CUDA engine requires of a run's schedule, checked when
// cuda::Trainer<Run> is instantiated: every op has CUDA kernels on a lane
// the engine runs, a pipeline stage's exchanges open its forward and
// backward and never share bytes with the transfer they are paired with,
// and quantized blocks are multiples of 32 elements.
#include <cstddef>
#include <string_view>

#include "../../core/diagnostic.hpp"
#include "../../cuda/op_context.cuh"
#include "../../ops/op.hpp"
#include "../../ops/pipeline.hpp"
#include "../../plan/schedule.hpp"
#include "../op_table.hpp"

namespace headroom::cuda {

namespace detail {
// Every op of the model runs on the CUDA engine: it has CUDA kernels, on the
// compute lane or the communication lane.
template <class S, class E>
constexpr bool check_kernel() {
  using O = typename E::op;
  HEADROOM_REQUIRE((ops::RunsOn<O, OpContext<S>>),
                   "cuda::Trainer: the op {} of layer {} has no kernel for the CUDA engine (it needs static forward(const "
                   "cuda::OpContext<S>&) and backward(const cuda::OpContext<S>&), or loss(k, grads), declared where "
                   "HEADROOM_CUDA_KERNELS is set)",
                   &O::name, &E::layer::kind);
  HEADROOM_REQUIRE(ops::lane_of<O>() == ops::Lane::compute || ops::lane_of<O>() == ops::Lane::communication,
                   "cuda::Trainer: the op {} of layer {} runs on the host-threads lane, which the CUDA engine does not run (it "
                   "runs the compute and communication lanes)",
                   &O::name, &E::layer::kind);
  return true;
}
template <class S, class... Es>
constexpr bool check_kernels(type_list<Es...>) {
  return (check_kernel<S, Es>() && ...);
}

// Pipeline parallelism: whether the first op of steps [from, to) (forward,
// backward or loss) is `op`.
template <class Sched>
constexpr bool opens_with(const Sched& sched, int from, int to, std::string_view op) {
  for (int g = from; g < to; ++g) {
    const Step& st = sched.steps[static_cast<std::size_t>(g)];
    if (st.kind == EventKind::forward || st.kind == EventKind::backward || st.kind == EventKind::loss) return st.op == op;
  }
  return false;
}
// The sends cuda::PipeExchange pairs with a receive never share bytes with
// it: pipe_send's output with its gradient, pipe_recv's input gradient with
// the input it receives (every copy of each).
template <class Sched>
constexpr bool pipe_pairs_apart(const Sched& sched) {
  Slot sent_out{}, got_grad{}, sent_grad{}, got_in{};
  for (const Step& st : sched.steps) {
    if (st.op == ops::PipelineSend::name && st.kind == EventKind::forward) sent_out = st.in[0];
    if (st.op == ops::PipelineSend::name && st.kind == EventKind::backward) got_grad = st.d_in[0];
    if (st.op == ops::PipelineRecv::name && st.kind == EventKind::backward) sent_grad = st.d_out[0];
    if (st.op == ops::PipelineRecv::name && st.kind == EventKind::forward) got_in = st.out[0];
  }
  return !trainers::overlap(sent_out, got_grad) && !trainers::overlap(sent_grad, got_in);
}
// Every quantized parameter's block is a multiple of 32 elements (kernels/quant_linear.cuh).
template <class Sched>
constexpr bool quant_blocks_fit(const Sched& sched) {
  for (const ParamSlot& p : sched.params)
    if (p.quant.kind != QuantKind::none && p.quant.block % 32 != 0) return false;
  return true;
}
}  // namespace detail

}  // namespace headroom::cuda
