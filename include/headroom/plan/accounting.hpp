#pragma once
// A plan's figures besides memory: the FLOPs of a step and what one rank
// communicates per optimizer step (plan/plan.hpp).
#include <cstdint>

#include "../graph/collectives.hpp"
#include "expand.hpp"

namespace headroom {

namespace detail {

// The step's FLOPs (forward, backward, recompute) and what one rank
// communicates per optimizer step (Communication), from graph b.
constexpr void account(Expanded& x, const graph::Graph& b) {
  for (const auto& op : b.ops) {
    const std::int64_t inst = b.instances(op.group);
    x.flops_fwd += inst * op.flops_fwd;
    x.flops_bwd += inst * op.flops_bwd;
  }
  for (const auto& ev : b.events)
    if (ev.kind == EventKind::recompute) {
      const std::int64_t inst = b.instances(ev.group);
      x.flops_recompute += inst * b.ops[ev.op].flops_fwd;
    }

  // communication per step (Communication)
  for (const auto& ev : b.events) {
    if (ev.kind != EventKind::collective) continue;
    const graph::Op& c = b.collectives[ev.collective];
    const std::int64_t inst = b.instances(ev.group);
    const std::int64_t micro = b.cfg.accumulate;
    using AllReduce = graph::collective::AllReduceGrads;
    using ReduceScatter = graph::collective::ReduceScatterGrads;
    using AllGather = graph::collective::AllGatherParams;
    if (c.kind == AllReduce::name) {
      const std::int64_t n0 = c[AllReduce::elements<0>], n1 = c[AllReduce::elements<1>];
      x.communication.all_reduce += inst * (n0 + n1) * b.cfg.act_bytes();
      x.communication.all_reduce_calls += inst * ((n0 > 0) + (n1 > 0));
    } else if (c.kind == ReduceScatter::name) {
      const std::int64_t s0 = c[ReduceScatter::shard_elements<0>], s1 = c[ReduceScatter::shard_elements<1>];
      x.communication.reduce_scatter += micro * inst * (s0 + s1) * b.cfg.dp * b.cfg.act_bytes();
      x.communication.reduce_scatter_calls += micro * inst * ((s0 > 0) + (s1 > 0));
    } else {
      const std::int64_t b0 = c[AllGather::block<0>], b1 = c[AllGather::block<1>], bs = c[AllGather::scales_block];
      x.communication.all_gather += micro * inst * (b0 + b1 + bs) * b.cfg.dp;
      x.communication.all_gather_calls += micro * inst * ((b0 > 0) + (b1 > 0) + (bs > 0));
    }
  }
  // tensor and pipeline parallelism: what each event's op exchanges (graph::Op::exchange_fwd / exchange_bwd)
  for (int e = 0; e < static_cast<int>(b.events.size()); ++e) {
    const graph::Event& ev = b.events[e];
    if (ev.op == graph::none || ev.kind == EventKind::collective) continue;
    const graph::Op& op = b.ops[ev.op];
    const std::int64_t inst = b.instances(ev.group) * b.cfg.accumulate;
    const bool bwd = ev.kind == EventKind::backward;
    const graph::Binding& bd = b.bindings[e];
    if (bwd && !bd.d_inout.valid() && !bd.d_out[0].valid() && !bd.d_in[0].valid()) continue;  // no gradient to exchange
    const graph::Exchange& ex = bwd ? op.exchange_bwd : op.exchange_fwd;
    x.communication.tensor_all_reduce += inst * ex.all_reduce;
    x.communication.tensor_all_reduce_calls += inst * ex.all_reduce_calls;
    x.communication.tensor_all_gather += inst * ex.all_gather;
    x.communication.tensor_all_gather_calls += inst * ex.all_gather_calls;
    x.communication.pipeline_sent += inst * ex.sent;
    x.communication.pipeline_received += inst * ex.received;
  }
  for (const auto& pr : b.params) {  // gradients summed before the update (trainers::held_gradient)
    if (!pr.trainable) continue;
    const std::int64_t inst = b.instances(pr.group);
    const std::int64_t bytes = inst * (b.cfg.sharded(2) ? b.cfg.shard(pr.elements()) : pr.elements()) * b.cfg.act_bytes();
    if (pr.stage_shared) {  // the first and last pipeline stages' shared table
      x.communication.stage_all_reduce += bytes;
      x.communication.stage_all_reduce_calls += inst;
    }
    if (pr.tensor_partial && b.cfg.tp > 1) {  // a LoRA matrix's partial sums
      x.communication.tensor_grad_all_reduce += bytes;
      x.communication.tensor_grad_all_reduce_calls += inst;
    }
  }
  if (b.cfg.sharded(1) && !b.cfg.sharded(3))  // ZeRO 1 and 2: the weights after the update
    for (const auto& pr : b.params) {
      if (!pr.trainable) continue;
      const std::int64_t inst = b.instances(pr.group);
      x.communication.all_gather += inst * b.cfg.shard(pr.elements()) * b.cfg.dp * b.cfg.act_bytes();
      x.communication.all_gather_calls += inst;
    }
}

}  // namespace detail
}  // namespace headroom
