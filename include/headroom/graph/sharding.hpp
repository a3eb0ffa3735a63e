#pragma once
// graph::Sharding: the collectives and fetches of a data-parallel or
// parameter-offloading run, recorded around the events that need them.
#include <cstdint>
#include <utility>

#include "collectives.hpp"
#include "graph.hpp"

namespace headroom::graph {

// Data parallelism and parameter offload as the step is recorded: ZeRO 3
// gathers and OffloadParameters fetches before each event that reads
// parameters (forward, recompute, backward), and the gradient collectives
// after the backward that completes them.
class Sharding : public Graph {
 public:
  using Graph::Graph;

 protected:
  detail::cvec<int> first_user_;   // per parameter: the first op (forward order) that reads it

  constexpr int push_collective(Op c) {
    const int e = push_event(EventKind::collective, c.node, c.group);
    c.event = e;
    collectives.push_back(c);
    events[e].collective = static_cast<int>(collectives.size()) - 1;
    return e;
  }

  // A collective of type C (graph/collectives.hpp) for the parameters of op `op`.
  template <class C>
  static constexpr Op collective_op(const Op& op) {
    Op c{};
    c.kind = C::name;
    c.lane = C::lane;
    c.node = op.node;
    c.group = op.group;
    return c;
  }
  // f(ops::Weight<Q>{}) for each place Q of an op's parameters.
  template <class F>
  static constexpr void for_each_weight(F&& f) {
    [&]<int... Q>(std::integer_sequence<int, Q...>) { (f(ops::Weight<Q>{}), ...); }(std::make_integer_sequence<int, max_weights>{});
  }

  // ZeRO 3: before an event of op `op` that reads parameters, a collective
  // gathers them from the ranks' shards into buffers that live until that
  // event (forward, recompute and backward each gather their own): the
  // operands of collective::AllGatherParams (graph/collectives.hpp).
  // The buffers are born one compute event earlier where that event is of
  // the same group (the op before, in the same Repeat instance): the engine
  // may then issue the gather before that event and overlap it (a prefetch
  // one op ahead). Returns the collective's event, or none.
  //
  // With OffloadParameters too (ZeRO-Infinity), the shards are stored in the
  // offload tier: a fetch event first copies this rank's shards to the device
  // and the gather reads them there (its weight bindings).
  constexpr int gather_params(const Op& op) {
    if (cfg.offload_params && !cfg.sharded(3)) return fetch_params(op);
    if (!cfg.sharded(3) || (op.param[0] == none && op.param[1] == none)) return none;
    using C = collective::AllGatherParams;
    const int ahead = compute_event_ahead(op);
    const int shards = cfg.offload_params ? fetch_params(op) : none;
    Op c = collective_op<C>(op);
    for_each_weight([&]<int Q>(ops::Weight<Q>) {
      const int p = op.param[Q];
      if (p == none) return;
      const Param pr = params[p];
      c.use(C::param<Q>, p, none);
      if constexpr (Q > 0) {
        if (pr.quant.kind != QuantKind::none) throw "ZeRO<3>: an op may read one quantized parameter, as its first (Weight<0>)";
      }
      const std::int64_t block =
          pr.quant.kind != QuantKind::none ? tensors[pr.weight].bytes : cfg.shard(pr.elements()) * cfg.act_bytes();
      c.set(C::block<Q>, block);
      c.output(C::values<Q>, Ref{gathered(pr.node, pr.group, block * cfg.dp), none});
      if (pr.quant.kind != QuantKind::none) {
        c.set(C::scales_block, tensors[pr.scales].bytes);
        c.output(C::scales, Ref{gathered(pr.node, pr.group, c[C::scales_block] * cfg.dp), none});
      }
    });
    const int e = push_collective(c);
    for (int o = 0; o < max_out; ++o) {
      if (!c.out[o].valid()) continue;
      bindings[e].out[o] = c.out[o];
      born_ahead(c.out[o], ahead, e);
    }
    read_gathered(shards, e);
    return e;
  }

  // The compute event before op's first, skipping collectives and fetches,
  // where it is of op's group (the op before, in the same Repeat instance),
  // else none: a buffer that event e of op fills may be born there, so the
  // engine can fill it one op ahead.
  constexpr int compute_event_ahead(const Op& op) const {
    int ahead = static_cast<int>(events.size()) - 1;
    while (ahead >= 0 && (events[ahead].kind == EventKind::collective || events[ahead].kind == EventKind::fetch)) --ahead;
    return ahead < 0 || events[ahead].group != op.group || events[ahead].op == none ? none : ahead;
  }

  // Buffer r, filled by event e: born at `ahead` (and used by e) where there is one, else at e.
  constexpr void born_ahead(Ref r, int ahead, int e) {
    if (ahead != none) {
      born(r, ahead);
      use(r, e);
    } else {
      born(r, e);
    }
  }

  constexpr int gathered(int node, int group, std::int64_t bytes) {
    const int t = new_tensor("gathered", Role::communication, bytes, group);
    tensors[t].node = node;
    grow(t);
    return t;
  }

  // Event e reads the parameters event `gather` gathered (a collective) or
  // fetched (from the offload tier): its out[q], and out[2] the scales of a
  // quantized parameter 0.
  constexpr void read_gathered(int gather, int e) {
    if (gather == none) return;
    const Binding g = bindings[gather];
    for (int q = 0; q < max_weights; ++q) {
      if (!g.out[q].valid()) continue;
      use(bindings[e].weight[q] = g.out[q], e);
      if (q == 0 && g.out[2].valid()) use(bindings[e].scales[0] = g.out[2], e);
    }
  }

  // OffloadParameters: before an event of op `op` that reads parameters, a
  // fetch event copies them (values or codes, and scales) from the offload
  // tier into device buffers (role weights) that live until that event:
  // in[q] / out[q] the parameter q's stored tensor and its device copy,
  // in[2] / out[2] the scales of a quantized parameter 0. As ZeRO 3's
  // gathers, the copies are born one compute event earlier where that event
  // is of the same group, so an engine may stream them one op ahead.
  // Returns the fetch's event, or none.
  constexpr int fetch_params(const Op& op) {
    if (op.param[0] == none && op.param[1] == none) return none;
    const int ahead = compute_event_ahead(op);
    const int e = push_event(EventKind::fetch, op.node, op.group);
    Binding& bd = bindings[e];
    auto fetch = [&](int slot, int stored, int node) {
      const int t = new_tensor("fetched", Role::weights, tensors[stored].bytes, op.group);
      tensors[t].node = node;
      grow(t);
      use(bd.in[slot] = Ref{stored, none}, e);
      bd.out[slot] = Ref{t, none};
      born_ahead(bd.out[slot], ahead, e);
    };
    for (int q = 0; q < max_weights; ++q) {
      const int p = op.param[q];
      if (p == none) continue;
      const Param pr = params[p];
      if (pr.quant.kind != QuantKind::none && q > 0)
        throw "OffloadParameters: an op may read one quantized parameter, as its first (Weight<0>)";
      fetch(q, pr.weight, pr.node);
      if (pr.quant.kind != QuantKind::none) fetch(2, pr.scales, pr.node);
    }
    return e;
  }

  // The gradient a collective averages, as its operands name it.
  template <int Q>
  constexpr void bind_gradient(Op& c, collective::AllReduceGrads, const Param& pr) const {
    using C = collective::AllReduceGrads;
    c.input(C::grad<Q>, Ref{pr.grad, none}, false);
  }
  template <int Q>
  constexpr void bind_gradient(Op& c, collective::ReduceScatterGrads, const Param& pr) const {
    using C = collective::ReduceScatterGrads;
    c.input(C::bucket<Q>, Ref{pr.grad, none}, false);
    if (pr.grad_shard != none) c.output(C::shard<Q>, Ref{pr.grad_shard, none});
    c.set(C::shard_elements<Q>, cfg.shard(pr.elements()));
  }

  // After the backward of op i: the gradients of the parameters whose last
  // writer it was (op i is the first to read them in forward order) are
  // complete, and one collective averages them over the data-parallel ranks:
  // an all-reduce in place (ZeRO 0 and 1), or a reduce-scatter of the bucket
  // into this rank's gradient shard (ZeRO 2 and 3). Returns the collective's
  // event, or none.
  template <class C>
  constexpr int average_grads(int i) {
    const Op op = ops[i];
    Op c = collective_op<C>(op);
    bool any = false;
    for_each_weight([&]<int Q>(ops::Weight<Q>) {
      const int p = op.param[Q];
      if (p == none || first_user_[p] != i || params[p].grad == none) return;
      any = true;
      c.use(C::template param<Q>, p, none);
      c.set(C::template elements<Q>, params[p].elements());
      bind_gradient<Q>(c, C{}, params[p]);
    });
    if (!any) return none;
    const int e = push_collective(c);
    for (int q = 0; q < max_weights; ++q) {
      if (c.in[q].valid()) use(bindings[e].in[q] = c.in[q], e);
      if (!c.out[q].valid()) continue;
      bindings[e].out[q] = c.out[q];
      // accumulated over micro-batches: the shard lives the whole step
      // (OffloadOptimizer: in the offload tier; the shard here lives one
      // event, filled with the sum so far first: Step::grad_load; but a
      // gradient summed on the device first, offloaded_after_sum, as without)
      if (cfg.accumulate > 1 && (!cfg.offload_optimizer || offloaded_after_sum(cfg, params[c.param[q]]))) use(c.out[q], e);
      else born(c.out[q], e);
    }
    return e;
  }

  constexpr int reduce_grads(int i) {
    if (cfg.dp <= 1) return none;
    return cfg.sharded(2) ? average_grads<collective::ReduceScatterGrads>(i) : average_grads<collective::AllReduceGrads>(i);
  }

  // OffloadOptimizer: the gradients op i completes (its parameters' first
  // user in forward order) are copied to the offload tier at the last event
  // that writes them (this backward, or the collective after it), where the
  // device's buffer dies; with Accumulate<K> each micro-batch's is added to
  // the offload tier's, which lives the whole step.
  constexpr void stream_grads(int i, int e) {
    if (!cfg.offload_optimizer) return;
    for (int q = 0; q < max_weights; ++q) {
      const int p = ops[i].param[q];
      if (p == none || first_user_[p] != i || params[p].host_grad == none || offloaded_after_sum(cfg, params[p])) continue;
      use(Ref{params[p].grad_shard != none ? params[p].grad_shard : params[p].grad, none}, e);
      if (cfg.accumulate > 1) use(Ref{params[p].host_grad, none}, e);
      else born(Ref{params[p].host_grad, none}, e);
    }
  }
};

}  // namespace headroom::graph
