#pragma once
// Steps 2 and 3 of a plan (plan/plan.hpp): a graph's groups expanded into
// the step's timeline, and each tensor instance resolved to one buffer with
// the events it lives; the plan's public records (Buffer, EventInfo,
// ParamInfo, NodeInfo, Communication).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "../core/cvec.hpp"
#include "../graph/graph.hpp"

namespace headroom {

struct Buffer {
  std::string_view name;
  int node = -1;       // the layer node that owns it (0: the model, for shared tables)
  int tensor = -1;     // graph tensor id (for the engine's lookup)
  int instance = 0;    // instance of its Repeat group; 0 when not repeated,
                       // -1 for one buffer shared by all instances (the residual gradient stream)
  int param = -1;      // the parameter it belongs to, if any
  Role role = Role::scratch;
  Tier tier = Tier::device;
  std::int64_t bytes = 0;  // bytes the tensor needs
  std::int64_t size = 0;   // bytes reserved (bytes rounded up to the alignment)
  std::int64_t align = 256;
  int first = 0, last = 0;  // events, inclusive
  std::int64_t offset = 0;  // in its tier's arena
  // Pipeline parallelism: copies, one per micro-batch in flight (size is
  // theirs together, each align_up(bytes, align) apart); born: the event
  // that writes a copy first (first is then the step's start).
  int copies = 1;
  int born = 0;

  constexpr bool alive_at(int e) const { return first <= e && e <= last; }
  constexpr std::int64_t end() const { return offset + size; }
};

struct EventInfo {
  EventKind kind = EventKind::forward;
  int node = -1;
  int instance = 0;       // instance of its Repeat group (0 when not repeated)
  int op = -1;            // the op run by forward / backward / recompute events
  bool repeated = false;  // one of the events of a Repeat's block
  // prefetch events: the instance whose activations come back. A repeated
  // block's are fetched one block ahead: the prefetch opening instance j's
  // backward fetches instance j-1 (none for j = 0), the one just before the
  // group's backward fetches the last instance.
  int fetches = -1;
};

struct ParamInfo {
  std::string_view name;
  int node = -1;
  std::int64_t rows = 0, cols = 0;
  int instances = 1;
  bool trainable = true;
  QuantDesc quant{};
};

struct NodeInfo {
  std::string_view name;
  std::string_view kind;
  int parent = -1;
  int index = -1;
  int repeat = 1;          // for a Repeat node: its count
  bool is_repeat = false;  // a Repeat node (its subtree is per instance)
  int group = -1;          // the Repeat group it lies in, -1 outside any
  int first_instance = 0;  // for a Repeat node: the model's block index of instance 0 (a pipeline stage's share)
};

// What one rank of a data-parallel run exchanges with the others in one
// optimizer step, by kind of collective: the payload (the bytes of the whole
// buffers it reduces or gathers) and the number of calls. A ring algorithm
// sends, and receives, 2 (N-1)/N of an all-reduce's payload per rank and
// (N-1)/N of a reduce-scatter's or an all-gather's (sent_per_rank).
//   all_reduce      ZeRO 0 and 1: each gradient, once per step (the last micro-batch)
//   reduce_scatter  ZeRO 2 and 3: each gradient bucket, every micro-batch
//   all_gather      ZeRO 3: each parameter before every event that reads it, every micro-batch;
//                   ZeRO 1 and 2: each trainable parameter after the update
// Besides these, the host engine all-reduces two 8-byte scalars per
// micro-batch and step (the loss; with ZeRO 1-3 the squared gradient norm).
struct Communication {
  // over the data-parallel ranks: payload bytes and calls per step
  std::int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  std::int64_t all_reduce_calls = 0, reduce_scatter_calls = 0, all_gather_calls = 0;
  // over a tensor-parallel group (TensorParallel<N>), per step: the sums of
  // activations and their gradients (tp_output forward and recompute,
  // tp_input backward) and the LM head's statistics (all-gathered per chunk)
  std::int64_t tensor_all_reduce = 0, tensor_all_gather = 0;
  std::int64_t tensor_all_reduce_calls = 0, tensor_all_gather_calls = 0;
  // over a tensor-parallel group, per step: the gradients of the LoRA
  // matrices every rank holds whole and computes a partial sum of
  // (graph::Param::tensor_partial), summed before the update
  std::int64_t tensor_grad_all_reduce = 0, tensor_grad_all_reduce_calls = 0;
  // with the neighbouring pipeline stages (PipelineParallel<S>), per step:
  // activations and their gradients, sent and received point to point
  std::int64_t pipeline_sent = 0, pipeline_received = 0;
  // between the first and the last pipeline stage, per step: the gradient
  // of an LM head's table they both hold (graph::Param::stage_shared), summed
  // before the update; its whole gradient, or with ZeRO 2 and 3 this rank's shard
  std::int64_t stage_all_reduce = 0, stage_all_reduce_calls = 0;
  constexpr std::int64_t payload() const { return all_reduce + reduce_scatter + all_gather; }
  constexpr std::int64_t tensor_payload() const { return tensor_all_reduce + tensor_all_gather + tensor_grad_all_reduce; }
  // Bytes one rank sends in a step with ring collectives over n ranks.
  constexpr double sent_per_rank(int n) const {
    if (n <= 1) return 0;
    const double f = static_cast<double>(n - 1) / n;
    return 2 * f * static_cast<double>(all_reduce) + f * static_cast<double>(reduce_scatter + all_gather);
  }
  // Bytes one rank sends over its tensor-parallel group of n ranks in a step (ring collectives).
  constexpr double tensor_sent_per_rank(int n) const {
    if (n <= 1) return 0;
    const double f = static_cast<double>(n - 1) / n;
    return 2 * f * static_cast<double>(tensor_all_reduce + tensor_grad_all_reduce) + f * static_cast<double>(tensor_all_gather);
  }
};

namespace detail {

// Everything the constexpr pipeline produces, in growable form.
struct Expanded {
  RunConfig cfg{};
  detail::cvec<Buffer> buffers;
  detail::cvec<EventInfo> events;
  detail::cvec<NodeInfo> nodes;
  detail::cvec<ParamInfo> params;
  std::int64_t peak[tier_count]{};
  std::int64_t lower_bound[tier_count]{};
  int bound_event[tier_count]{};
  std::int64_t flops_fwd = 0, flops_bwd = 0, flops_recompute = 0;
  Communication communication{};
  bool valid = true;  // the check run when the plan was made

  // The check, recomputed from these arrays.
  constexpr bool recheck() const;
};

struct Timeline {
  detail::cvec<int> base, stride, count;  // per unexpanded event
  int total = 0;
  constexpr int at(int e, int inst) const { return base[e] + inst * stride[e]; }
};

constexpr Timeline expand_events(const graph::Graph& b) {
  Timeline tl;
  const int n = static_cast<int>(b.events.size());
  tl.base.assign(n, 0);
  tl.stride.assign(n, 0);
  tl.count.assign(n, 1);
  detail::cvec<char> seen(b.groups.size(), 0);
  int g_at = 0;
  int e = 0;
  while (e < n) {
    const int g = b.events[e].group;
    if (g == graph::none) {
      tl.base[e] = g_at++;
      ++e;
      continue;
    }
    int len = 0;
    while (e + len < n && b.events[e + len].group == g) ++len;
    const int N = b.groups[g].count;
    const bool backward = seen[g];
    seen[g] = true;
    for (int k = 0; k < len; ++k) {
      tl.count[e + k] = N;
      tl.base[e + k] = backward ? g_at + (N - 1) * len + k : g_at + k;
      tl.stride[e + k] = backward ? -len : len;
    }
    g_at += N * len;
    e += len;
  }
  tl.total = g_at;
  return tl;
}

// The global events an endpoint stands for, for tensor instance j:
// [lo, hi], or lo > hi when it does not apply.
struct Span {
  int lo, hi;
};
constexpr Span resolve(const graph::Endpoint& ep, int j, int tensor_count, const Timeline& tl) {
  constexpr Span none{1, 0};
  if (ep.only >= 0 && j != ep.only) return none;
  if (ep.only == graph::not_last && j == tensor_count - 1) return none;
  const int n = tl.count[ep.event];
  if (ep.abs == graph::all_instances) {
    const int a = tl.at(ep.event, 0), z = tl.at(ep.event, n - 1);
    return Span{a < z ? a : z, a < z ? z : a};
  }
  const int inst = ep.abs >= 0 ? ep.abs : j + ep.rel;
  if (inst < 0 || inst >= n) return none;
  const int g = tl.at(ep.event, inst);
  return Span{g, g};
}

// How many buffers a graph's tensors make: one per instance (one for a
// collapsed tensor); virtual and aliased tensors make none.
constexpr std::size_t buffer_count(const graph::Graph& b) {
  std::size_t n = 0;
  for (const auto& t : b.tensors) {
    if (t.is_virtual || t.alias != graph::none || t.bytes <= 0) continue;
    n += (t.group == graph::none || t.collapsed) ? 1 : static_cast<std::size_t>(b.groups[t.group].count);
  }
  return n;
}

// The expanded events (with what each prefetch fetches), nodes and
// parameters of graph b: x.events, x.nodes, x.params.
constexpr void describe(Expanded& x, const graph::Graph& b, const Timeline& tl) {
  const int E = tl.total;
  x.events.assign(E, EventInfo{});
  for (int e = 0; e < static_cast<int>(b.events.size()); ++e)
    for (int j = 0; j < tl.count[e]; ++j)
      x.events[tl.at(e, j)] = EventInfo{b.events[e].kind, b.events[e].node, tl.count[e] > 1 ? j : 0, b.events[e].op,
                                        b.events[e].group != graph::none, -1};
  // what each prefetch fetches (see EventInfo::fetches)
  for (int e = 0; e < static_cast<int>(b.events.size()); ++e) {
    if (b.events[e].kind != EventKind::prefetch) continue;
    for (int j = 0; j < tl.count[e]; ++j) {
      auto& ev = x.events[tl.at(e, j)];
      if (ev.repeated) {
        ev.fetches = j - 1;
      } else {
        const bool opens_group = e + 1 < static_cast<int>(b.events.size()) && b.events[e + 1].kind == EventKind::prefetch &&
                                 b.events[e + 1].group != graph::none;
        ev.fetches = opens_group ? b.groups[b.events[e + 1].group].count - 1 : 0;
      }
    }
  }
  for (int k = 0; k < static_cast<int>(b.nodes.size()); ++k) {
    const auto& n = b.nodes[k];
    bool rep = false;
    for (const auto& g : b.groups) rep = rep || g.node == k;
    x.nodes.push_back(NodeInfo{n.name, n.kind, n.parent, n.index, n.repeat, rep, n.group, n.first_instance});
  }
  for (int p = 0; p < static_cast<int>(b.params.size()); ++p) {
    const auto& pr = b.params[p];
    const int inst = b.instances(pr.group);
    x.params.push_back(ParamInfo{pr.name, pr.node, pr.rows, pr.cols, inst, pr.trainable, pr.quant});
  }
}

// The end of the forward: the loss event, or (a pipeline stage before the
// last) the event before the first backward.
constexpr int forward_end(const Expanded& x) {
  const int E = static_cast<int>(x.events.size());
  int loss_event = E - 1;
  bool has_loss = false;
  for (int e = 0; e < E; ++e)
    if (x.events[e].kind == EventKind::loss) loss_event = e, has_loss = true;
  if (!has_loss)
    for (int e = E - 1; e >= 0; --e)
      if (x.events[e].kind == EventKind::backward) loss_event = e - 1;
  return loss_event;
}

// One buffer per tensor instance, alive over the events [first, last] its
// endpoints span: x.buffers (not yet placed). A saved activation's copies
// per micro-batch in flight under 1F1B are one buffer of copies x its size.
constexpr void resolve_buffers(Expanded& x, const graph::Graph& b, const Timeline& tl, int loss_event) {
  const int E = tl.total;
  detail::cvec<int> param_of(b.tensors.size(), -1);  // the parameter a tensor belongs to
  for (int p = 0; p < static_cast<int>(b.params.size()); ++p) {
    const auto& pr = b.params[p];
    for (int t : {pr.weight, pr.scales, pr.master, pr.grad, pr.state, pr.grad_shard, pr.host_grad})
      if (t != graph::none) param_of[t] = p;
  }

  // endpoints grouped by tensor
  const int T = static_cast<int>(b.tensors.size());
  detail::cvec<int> start(T + 1, 0);
  for (const auto& ep : b.endpoints) ++start[ep.tensor + 1];
  for (int t = 0; t < T; ++t) start[t + 1] += start[t];
  detail::cvec<int> eps(b.endpoints.size(), 0);
  {
    detail::cvec<int> fill(start);
    for (int k = 0; k < static_cast<int>(b.endpoints.size()); ++k) eps[fill[b.endpoints[k].tensor]++] = k;
  }

  // one buffer per tensor instance
  x.buffers.reserve(buffer_count(b));
  const std::int64_t A = b.cfg.alignment;
  for (int t = 0; t < T; ++t) {
    const auto& tr = b.tensors[t];
    if (tr.is_virtual || tr.alias != graph::none || tr.bytes <= 0) continue;
    const int count = b.instances(tr.group);
    const int instances = tr.collapsed ? 1 : count;
    int cf = E, cl = -1;  // collapsed: the union over instances
    for (int j = 0; j < count; ++j) {
      int first = E, last = -1;
      for (int k = start[t]; k < start[t + 1]; ++k) {
        const auto& ep = b.endpoints[eps[k]];
        const Span s = resolve(ep, j, count, tl);
        if (s.lo > s.hi) continue;
        if (ep.birth) first = std::min(first, s.lo);
        last = std::max(last, s.hi);
      }
      if (tr.persistent) {
        first = 0;
        last = E - 1;
      }
      if (first == E) {  // never born: the graph is inconsistent
        x.valid = false;
        first = last = 0;
      }
      last = std::max(last, first);
      if (tr.collapsed) {
        cf = std::min(cf, first);
        cl = std::max(cl, last);
        if (j + 1 < count) continue;
        first = cf;
        last = cl;
      }
      Buffer& buf = x.buffers.emplace_back();
      buf.name = tr.name;
      buf.node = tr.node;
      buf.tensor = t;
      buf.instance = tr.collapsed ? -1 : (instances > 1 ? j : 0);
      buf.param = param_of[t];
      buf.role = tr.role;
      if (buf.role == Role::activation && last > loss_event) buf.role = Role::saved_activation;
      buf.tier = tr.tier;
      buf.bytes = tr.bytes;
      buf.align = A;
      buf.size = align_up(tr.bytes, A);
      buf.first = buf.born = first;
      buf.last = last;
      // pipeline parallelism: what a micro-batch's forward leaves for its
      // backward (saved activations, the token ids) exists once per
      // micro-batch in flight on this stage, for the whole step
      const int copies = b.cfg.in_flight();
      if (copies > 1 && !tr.persistent && first <= loss_event && last > loss_event &&
          (buf.role == Role::saved_activation || buf.role == Role::batch_io)) {
        buf.copies = copies;
        buf.size *= copies;
        buf.first = 0;
        buf.last = E - 1;
      }
    }
  }
}

}  // namespace detail
}  // namespace headroom
