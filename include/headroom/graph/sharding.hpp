#pragma once
// graph::Sharding: the collectives and fetches of a data-parallel or
// parameter-offloading run, recorded around the events that need them.
#include <cstdint>

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
    c.lane = ops::Lane::communication;
    collectives.push_back(c);
    events[e].collective = static_cast<int>(collectives.size()) - 1;
    return e;
  }

  // ZeRO 3: before an event of op `op` that reads parameters, a collective
  // gathers them from the ranks' shards into buffers that live until that
  // event (forward, recompute and backward each gather their own). Layout:
  // out[q] the values (or codes) of parameter q, out[2] the scales of a
  // quantized parameter 0; dim[o] the bytes of one rank's block of out[o].
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
    const int ahead = compute_event_ahead(op);
    const int shards = cfg.offload_params ? fetch_params(op) : none;
    Op c{};
    c.kind = collective::all_gather_params;
    c.node = op.node;
    c.group = op.group;
    for (int q = 0; q < max_weights; ++q) c.param[q] = op.param[q];
    const int e = push_collective(c);
    Op& g = collectives.back();
    for (int q = 0; q < max_weights; ++q) {
      const int p = op.param[q];
      if (p == none) continue;
      const Param pr = params[p];
      if (pr.quant.kind != QuantKind::none && q > 0)
        throw "ZeRO<3>: an op may read one quantized parameter, as its first (Weight<0>)";
      const std::int64_t block =
          pr.quant.kind != QuantKind::none ? tensors[pr.weight].bytes : cfg.shard(pr.elements()) * cfg.act_bytes();
      g.dim[q] = block;
      g.out[q] = Ref{gathered(pr.node, pr.group, block * cfg.dp), none};
      if (pr.quant.kind != QuantKind::none) {
        g.dim[2] = tensors[pr.scales].bytes;
        g.out[2] = Ref{gathered(pr.node, pr.group, g.dim[2] * cfg.dp), none};
      }
    }
    for (int o = 0; o < max_out; ++o) {
      if (!g.out[o].valid()) continue;
      bindings[e].out[o] = g.out[o];
      born_ahead(g.out[o], ahead, e);
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

  // After the backward of op i: the gradients of the parameters whose last
  // writer it was (op i is the first to read them in forward order) are
  // complete, and one collective averages them over the data-parallel ranks:
  // an all-reduce in place (ZeRO 0 and 1), or a reduce-scatter of the bucket
  // into this rank's gradient shard (ZeRO 2 and 3). in[q] / out[q]: the
  // bucket / shard of parameter q; dim[2q], dim[2q+1]: its elements and
  // shard elements. Returns the collective's event, or none.
  constexpr int reduce_grads(int i) {
    if (cfg.dp <= 1) return none;
    const Op op = ops[i];
    Op c{};
    c.kind = cfg.sharded(2) ? collective::reduce_scatter_grads : collective::all_reduce_grads;
    c.node = op.node;
    c.group = op.group;
    bool any = false;
    for (int q = 0; q < max_weights; ++q) {
      const int p = op.param[q];
      if (p == none || first_user_[p] != i || params[p].grad == none) continue;
      any = true;
      c.param[q] = p;
      c.dim[2 * q] = params[p].elements();
      c.dim[2 * q + 1] = cfg.shard(params[p].elements());
      c.in[q] = Ref{params[p].grad, none};
      if (params[p].grad_shard != none) c.out[q] = Ref{params[p].grad_shard, none};
    }
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
