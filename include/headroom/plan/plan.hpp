#pragma once
// The plan of one training step, computed at compile time:
//
//   constexpr auto plan = headroom::plan<Run>();
//   static_assert(plan.peak_bytes() <= 24_GiB);
//   static_assert(headroom::fits<Run, 24_GiB>);   // the same, naming both numbers when it fails (plan/budget.hpp)
//
// Steps (all constexpr):
//   1. build   the model's graph (graph/graph.hpp): ops, tensors, events, endpoints;
//   2. expand  groups (Repeat) into the global timeline: event e of instance j
//              of a group sits at base[e] + j * stride[e] (stride < 0 in backward);
//   3. resolve each tensor instance to one buffer with [first, last] events;
//   4. pack    each tier: a sweep in birth order, best-fit into the gaps left by
//              dead buffers, with gradients (born in backward, alive to the
//              update) packed from the top of the arena so they meet the
//              activations they replace instead of fragmenting them;
//   5. check   that no two buffers alive at one event overlap, and compute the
//              liveness lower bound (max over events of the bytes alive).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "../graph/backward.hpp"
#include "../run.hpp"

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

// ---- packing ------------------------------------------------------------------------------
// The sweeps below work on plain integer arrays (constant evaluation is
// interpretation: fewer, simpler accesses compile faster).
struct Spans {
  cvec<int> first, last;
  cvec<std::int64_t> size, offset;
  template <class Bufs>
  constexpr explicit Spans(const Bufs& bufs, const cvec<int>& ids) {
    first.reserve(ids.size());
    last.reserve(ids.size());
    size.reserve(ids.size());
    offset.reserve(ids.size());
    for (int i : ids) {
      first.push_back(bufs[i].first);
      last.push_back(bufs[i].last);
      size.push_back(bufs[i].size);
      offset.push_back(bufs[i].offset);
    }
  }
};

// Orders items by key, ascending (bottom-up merge sort on plain arrays;
// raw pointers: every call costs in constant evaluation).
constexpr void sort_by_key(cvec<int>& items, const cvec<std::int64_t>& keys) {
  const std::size_t n = items.size();
  cvec<int> buf(n, 0);
  const std::int64_t* key = keys.begin();
  int* from = items.begin();
  int* to = buf.begin();
  for (std::size_t width = 1; width < n; width *= 2) {
    for (std::size_t lo = 0; lo < n; lo += 2 * width) {
      const std::size_t mid = lo + width < n ? lo + width : n;
      const std::size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
      std::size_t x = lo, y = mid, o = lo;
      while (x < mid && y < hi) to[o++] = key[from[y]] < key[from[x]] ? from[y++] : from[x++];
      while (x < mid) to[o++] = from[x++];
      while (y < hi) to[o++] = from[y++];
    }
    int* t = from;
    from = to;
    to = t;
  }
  if (from != items.begin())
    for (std::size_t k = 0; k < n; ++k) items[k] = from[k];
}

// Orders items by birth event, then longest-lived first (or largest first),
// then largest: a counting sort on the birth event (O(n + events)),
// insertion sort inside each event's small bucket.
constexpr void sort_by_birth(cvec<int>& items, const Spans& s, int events, bool largest_first = false) {
  const int* first = s.first.begin();
  const int* last = s.last.begin();
  const std::int64_t* size = s.size.begin();
  cvec<int> start_v(static_cast<std::size_t>(events) + 1, 0);
  int* start = start_v.begin();
  for (int i : items) ++start[first[i] + 1];
  for (int e = 0; e < events; ++e) start[e + 1] += start[e];
  cvec<int> out_v(items.size(), 0);
  int* out = out_v.begin();
  for (int i : items) out[start[first[i]]++] = i;
  for (std::size_t k = 1; k < items.size(); ++k) {
    const int v = out[k];
    std::size_t j = k;
    while (j > 0) {
      const int u = out[j - 1];
      if (first[u] != first[v]) break;
      bool before;
      if (largest_first && size[v] != size[u]) before = size[v] > size[u];
      else if (last[v] != last[u]) before = last[v] > last[u];
      else before = size[v] > size[u];
      if (!before) break;
      out[j] = u;
      --j;
    }
    out[j] = v;
  }
  items = out_v;
}

// A buffer already placed, as the check's sweep sees it.
struct Placed {
  std::int64_t offset = 0, end = 0;
  int last = 0;
};

struct PackOrder {
  bool largest_first = false;  // within one birth event: largest first (else longest-lived first)
};

// Packs the buffers of one tier (their spans `s`); writes s.offset and
// returns the arena size.
//   1. buffers alive the whole step (weights, scales, master weights,
//      optimizer state) go first, back to back from offset 0;
//   2. what backward creates and keeps to the end (parameter gradients, the
//      residual gradient stream) is stacked down from the arena's end, in
//      birth order, so it takes the room the freed activations leave;
//   3. everything else is swept in birth order, each buffer into the
//      smallest gap between the buffers still alive (best fit), above 1.
//      The sweep keeps the gaps, not the live buffers: a placement scans
//      the gaps (far fewer than the buffers alive: the saved activations
//      lie back to back), a death merges one buffer into its neighbours.
constexpr std::int64_t pack(Spans& s, int events, int loss_event, PackOrder how = {}) {
  const int n = static_cast<int>(s.first.size());
  const int* first = s.first.begin();
  const int* last = s.last.begin();
  const std::int64_t* size = s.size.begin();
  std::int64_t* offset = s.offset.begin();
  std::int64_t base = 0;
  cvec<int> bottom, top;
  for (int k = 0; k < n; ++k) {
    if (first[k] == 0 && last[k] == events - 1) {
      offset[k] = base;
      base += size[k];
    } else if (first[k] >= loss_event && last[k] >= events - 2) {
      top.push_back(k);
    } else {
      bottom.push_back(k);
    }
  }
  sort_by_birth(bottom, s, events, how.largest_first);
  sort_by_birth(top, s, events);
  // The free room below the end of the highest live buffer (`top_end`, base
  // when none lives): its maximal intervals [gap_lo, gap_hi), sorted by
  // offset. Sizes are positive (empty tensors get no buffer), so two live
  // buffers never share an end and the gaps are exactly the room between
  // consecutive live buffers.
  const std::size_t room = bottom.size() + 1;
  cvec<std::int64_t> gap_lo_v(room, 0), gap_hi_v(room, 0);
  std::int64_t* gap_lo = gap_lo_v.begin();
  std::int64_t* gap_hi = gap_hi_v.begin();
  std::size_t gaps = 0;
  std::int64_t top_end = base;
  // the bottom buffers placed so far, listed by their last event
  cvec<int> dies_head_v(static_cast<std::size_t>(events), -1), dies_next_v(static_cast<std::size_t>(n), -1);
  int* dies_head = dies_head_v.begin();
  int* dies_next = dies_next_v.begin();
  int freed_through = -1;  // every placed buffer whose last event is at most this one is free
  for (int i : bottom) {
    const int born = first[i];
    // free what died before this birth: merge it into its neighbouring gaps
    for (int e = freed_through + 1; e < born; ++e) {
      for (int j = dies_head[e]; j >= 0; j = dies_next[j]) {
        const std::int64_t lo = offset[j], hi = lo + size[j];
        if (hi == top_end) {  // the highest: the top comes down past any gap below it
          top_end = lo;
          if (gaps > 0 && gap_hi[gaps - 1] == top_end) top_end = gap_lo[--gaps];
          continue;
        }
        std::size_t a = 0, z = gaps;  // the first gap above lo
        while (a < z) {
          const std::size_t m = (a + z) / 2;
          if (gap_lo[m] < lo) a = m + 1;
          else z = m;
        }
        const bool left = a > 0 && gap_hi[a - 1] == lo, right = a < gaps && gap_lo[a] == hi;
        if (left && right) {
          gap_hi[a - 1] = gap_hi[a];
          for (std::size_t k = a + 1; k < gaps; ++k) gap_lo[k - 1] = gap_lo[k], gap_hi[k - 1] = gap_hi[k];
          --gaps;
        } else if (left) {
          gap_hi[a - 1] = hi;
        } else if (right) {
          gap_lo[a] = lo;
        } else {
          for (std::size_t k = gaps; k > a; --k) gap_lo[k] = gap_lo[k - 1], gap_hi[k] = gap_hi[k - 1];
          gap_lo[a] = lo;
          gap_hi[a] = hi;
          ++gaps;
        }
      }
    }
    if (born - 1 > freed_through) freed_through = born - 1;
    // best fit: the smallest gap that holds it, the lowest of equals; else on top
    const std::int64_t sz = size[i];
    std::size_t best = gaps;
    std::int64_t best_gap = -1;
    for (std::size_t k = 0; k < gaps; ++k) {
      const std::int64_t g = gap_hi[k] - gap_lo[k];
      if (g >= sz && (best_gap < 0 || g < best_gap)) {
        best_gap = g;
        best = k;
      }
    }
    if (best == gaps) {
      offset[i] = top_end;
      top_end += sz;
    } else {
      offset[i] = gap_lo[best];
      gap_lo[best] += sz;
      if (gap_lo[best] == gap_hi[best]) {
        for (std::size_t k = best + 1; k < gaps; ++k) gap_lo[k - 1] = gap_lo[k], gap_hi[k - 1] = gap_hi[k];
        --gaps;
      }
    }
    dies_next[i] = dies_head[last[i]];
    dies_head[last[i]] = i;
  }
  // depth of the top stack per event: non-decreasing (it never pops)
  cvec<std::int64_t> depth_v(events, 0);
  cvec<std::int64_t> top_at(top.size(), 0);
  std::int64_t* depth = depth_v.begin();
  std::int64_t d = 0;
  for (std::size_t k = 0; k < top.size(); ++k) {
    d += size[top[k]];
    top_at[k] = d;
    depth[first[top[k]]] = d;
  }
  for (int e = 1; e < events; ++e)
    if (depth[e] < depth[e - 1]) depth[e] = depth[e - 1];
  // the arena must hold every bottom buffer below the top stack as deep as it
  // gets while that buffer lives, i.e. at its last event
  std::int64_t arena = base + depth[events - 1];
  for (int i : bottom) arena = std::max(arena, offset[i] + size[i] + depth[last[i]]);
  for (std::size_t k = 0; k < top.size(); ++k) offset[top[k]] = arena - top_at[k];
  return arena;
}

// No two buffers alive at a common event may overlap, every buffer lies in
// the arena and is aligned. The check assumes nothing about how the packer
// worked; it splits the buffers only by their lifetimes:
//   W  alive the whole step: pairwise disjoint, and below every other buffer;
//   L  alive to the end of backward (last >= events - 2): all alive together
//      there, so pairwise disjoint (sorted by offset, neighbours compared);
//   O  the rest: swept in birth order against every O still alive, and
//      against the L buffers they overlap in space (found by binary search),
//      which must be born after they die.
constexpr bool check(const Spans& s, std::int64_t arena, int events, std::int64_t align) {
  const int n = static_cast<int>(s.first.size());
  const int* first = s.first.begin();
  const int* last = s.last.begin();
  const std::int64_t* size = s.size.begin();
  const std::int64_t* offset = s.offset.begin();
  cvec<int> whole, tail, rest;
  for (int k = 0; k < n; ++k) {
    if (offset[k] < 0 || offset[k] + size[k] > arena || offset[k] % align != 0) return false;
    if (first[k] == 0 && last[k] == events - 1) whole.push_back(k);
    else if (last[k] >= events - 2) tail.push_back(k);
    else rest.push_back(k);
  }
  sort_by_key(whole, s.offset);
  std::int64_t floor = 0;
  for (int k : whole) {
    if (offset[k] < floor) return false;
    floor = offset[k] + size[k];
  }
  sort_by_key(tail, s.offset);
  const int* t = tail.begin();
  const std::size_t nt = tail.size();
  for (std::size_t k = 0; k < nt; ++k) {
    if (offset[t[k]] < floor) return false;
    if (k > 0 && offset[t[k - 1]] + size[t[k - 1]] > offset[t[k]]) return false;
  }
  sort_by_birth(rest, s, events);
  cvec<Placed> live_v;  // O buffers alive at the current birth
  live_v.reserve(rest.size() + 1);
  for (int i : rest) {
    const int born = first[i];
    const std::int64_t lo = offset[i], hi = lo + size[i];
    if (lo < floor) return false;  // would overlap a whole-step buffer
    std::size_t w = 0;
    Placed* live = live_v.begin();
    const std::size_t count = live_v.size();
    for (std::size_t k = 0; k < count; ++k) {
      if (live[k].last < born) continue;
      if (live[k].offset < hi && lo < live[k].end) return false;  // alive together and overlapping
      if (w != k) live[w] = live[k];
      ++w;
    }
    while (live_v.size() > w) live_v.pop_back();
    live_v.push_back(Placed{lo, hi, last[i]});
    // the first tail buffer ending after lo, then every one starting before hi
    std::size_t a = 0, z = nt;
    while (a < z) {
      const std::size_t m = (a + z) / 2;
      if (offset[t[m]] + size[t[m]] <= lo) a = m + 1;
      else z = m;
    }
    for (std::size_t k = a; k < nt && offset[t[k]] < hi; ++k)
      if (first[t[k]] <= last[i]) return false;
  }
  return true;
}

// The check over buffers `ids` of a buffer array (bytes fit the reserved size).
template <class Bufs>
constexpr bool check(const Bufs& bufs, const cvec<int>& ids, std::int64_t arena, int events) {
  std::int64_t align = 0;
  for (int i : ids) {
    if (bufs[i].size < bufs[i].bytes) return false;
    align = bufs[i].align;
  }
  return check(Spans(bufs, ids), arena, events, align > 0 ? align : 1);
}

// The check, tier by tier, over a whole buffer array (Plan::recheck and
// RuntimePlan::recheck).
template <class Bufs>
constexpr bool recheck(const Bufs& bufs, const std::int64_t* peak, int events) {
  for (int t = 0; t < tier_count; ++t) {
    cvec<int> ids;
    for (std::size_t i = 0; i < bufs.size(); ++i)
      if (static_cast<int>(bufs[i].tier) == t) ids.push_back(static_cast<int>(i));
    if (!check(bufs, ids, peak[t], events)) return false;
  }
  return true;
}

template <class R>
constexpr graph::Graph build_graph() {
  graph::StepBuilder b{R::config()};
  b.open_batch();
  b.nodes[0].kind = R::model::kind;
  const graph::Ref out = R::model::build(b, b.tokens);
  b.loss = b.cfg.last_stage() ? out : graph::Ref{};  // a pipeline stage before the last sends its output instead
  // an LM head tied to the embedding table: the first stage's table and the last stage's copy (layers/pipeline_stages.hpp)
  if (b.cfg.pp > 1 && pipeline_stages::tied_head<typename R::model>() && (b.cfg.first_stage() || b.cfg.last_stage())) {
    if (b.tied_weight == graph::none) b.tied_table_missing = true;
    else b.params[b.tied_weight].stage_shared = true;
  }
  b.finish();
  return b;
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

// Expands and resolves a built graph's buffers; with Pack, also places them.
template <bool Pack = true>
constexpr Expanded expand_graph(const graph::Graph& b) {
  Expanded x;
  x.cfg = b.cfg;
  const Timeline tl = expand_events(b);
  const int E = tl.total;

  // events
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
  // the end of the forward: the loss, or (a pipeline stage before the last)
  // the event before the first backward
  int loss_event = E - 1;
  bool has_loss = false;
  for (int e = 0; e < E; ++e)
    if (x.events[e].kind == EventKind::loss) loss_event = e, has_loss = true;
  if (!has_loss)
    for (int e = E - 1; e >= 0; --e)
      if (x.events[e].kind == EventKind::backward) loss_event = e - 1;

  for (int k = 0; k < static_cast<int>(b.nodes.size()); ++k) {
    const auto& n = b.nodes[k];
    bool rep = false;
    for (const auto& g : b.groups) rep = rep || g.node == k;
    x.nodes.push_back(NodeInfo{n.name, n.kind, n.parent, n.index, n.repeat, rep, n.group, n.first_instance});
  }
  detail::cvec<int> param_of(b.tensors.size(), -1);
  for (int p = 0; p < static_cast<int>(b.params.size()); ++p) {
    const auto& pr = b.params[p];
    const int inst = pr.group == graph::none ? 1 : b.groups[pr.group].count;
    x.params.push_back(ParamInfo{pr.name, pr.node, pr.rows, pr.cols, inst, pr.trainable, pr.quant});
    for (int t : {pr.weight, pr.scales, pr.master, pr.grad, pr.state, pr.grad_shard, pr.host_grad})
      if (t != graph::none) param_of[t] = p;
  }

  // flops
  for (const auto& op : b.ops) {
    const std::int64_t inst = op.group == graph::none ? 1 : b.groups[op.group].count;
    x.flops_fwd += inst * op.flops_fwd;
    x.flops_bwd += inst * op.flops_bwd;
  }
  for (const auto& ev : b.events)
    if (ev.kind == EventKind::recompute) {
      const std::int64_t inst = ev.group == graph::none ? 1 : b.groups[ev.group].count;
      x.flops_recompute += inst * b.ops[ev.op].flops_fwd;
    }

  // communication per step (Communication)
  for (const auto& ev : b.events) {
    if (ev.kind != EventKind::collective) continue;
    const graph::Op& c = b.collectives[ev.collective];
    const std::int64_t inst = ev.group == graph::none ? 1 : b.groups[ev.group].count;
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
    const std::int64_t inst = (ev.group == graph::none ? 1 : b.groups[ev.group].count) * b.cfg.accumulate;
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
  for (const auto& pr : b.params) {  // gradients summed before the update (trainers::gradient_to_sum)
    if (!pr.trainable) continue;
    const std::int64_t inst = pr.group == graph::none ? 1 : b.groups[pr.group].count;
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
      const std::int64_t inst = pr.group == graph::none ? 1 : b.groups[pr.group].count;
      x.communication.all_gather += inst * b.cfg.shard(pr.elements()) * b.cfg.dp * b.cfg.act_bytes();
      x.communication.all_gather_calls += inst;
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
    const int count = tr.group == graph::none ? 1 : b.groups[tr.group].count;
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

  if constexpr (Pack) {
    // pack and bound each tier
    for (int tier = 0; tier < tier_count; ++tier) {
      detail::cvec<int> ids;
      for (int i = 0; i < static_cast<int>(x.buffers.size()); ++i)
        if (static_cast<int>(x.buffers[i].tier) == tier) ids.push_back(i);
      // two tie-breaks within a birth event; keep the smaller arena
      Spans spans(x.buffers, ids);
      const std::int64_t a1 = pack(spans, E, loss_event, PackOrder{true});
      const detail::cvec<std::int64_t> kept = spans.offset;
      x.peak[tier] = pack(spans, E, loss_event, PackOrder{false});
      if (a1 < x.peak[tier]) {
        x.peak[tier] = a1;
        spans.offset = kept;
      }
      for (std::size_t k = 0; k < ids.size(); ++k) x.buffers[ids[k]].offset = spans.offset[k];
      x.valid = x.valid && check(spans, x.peak[tier], E, b.cfg.alignment);
      for (int i : ids) x.valid = x.valid && x.buffers[i].size >= x.buffers[i].bytes;
      detail::cvec<std::int64_t> delta(E + 1, 0);
      for (std::size_t k = 0; k < ids.size(); ++k) {
        delta[spans.first[k]] += spans.size[k];
        delta[spans.last[k] + 1] -= spans.size[k];
      }
      std::int64_t alive = 0;
      for (int e = 0; e < E; ++e) {
        alive += delta[e];
        if (alive > x.lower_bound[tier]) {
          x.lower_bound[tier] = alive;
          x.bound_event[tier] = e;
        }
      }
    }
  }
  return x;
}

// Builds, expands and resolves R's buffers; with Pack, also places them.
template <class R, bool Pack = true>
constexpr Expanded expand() {
  return expand_graph<Pack>(build_graph<R>());
}

struct Sizes {
  std::size_t buffers, events, nodes, params;
  std::int64_t parameters = 0, trainable = 0;  // elements, all instances
  bool tied_table_missing = false;             // graph::Graph::tied_table_missing
};

// Array sizes of R's plan, from the graph alone (no resolution, no packing).
template <class R>
constexpr Sizes sizes() {
  const graph::Graph b = build_graph<R>();
  const std::size_t buffers = buffer_count(b);
  std::int64_t parameters = 0, trainable = 0;
  for (const auto& pr : b.params) {
    const std::int64_t n = pr.rows * pr.cols * (pr.group == graph::none ? 1 : b.groups[pr.group].count);
    parameters += n;
    if (pr.trainable) trainable += n;
  }
  return Sizes{buffers,   static_cast<std::size_t>(expand_events(b).total), b.nodes.size(), b.params.size(), parameters,
               trainable, b.tied_table_missing};
}

}  // namespace detail

// The plan of one training step of run R.
template <std::size_t NB, std::size_t NE, std::size_t NN, std::size_t NP>
struct Plan {
  RunConfig config{};
  std::array<Buffer, NB> buffers{};
  std::array<EventInfo, NE> events{};
  std::array<NodeInfo, NN> nodes{};
  std::array<ParamInfo, NP> params{};
  std::int64_t peak[tier_count]{};
  std::int64_t bound[tier_count]{};
  int bound_at[tier_count]{};
  std::int64_t flops_fwd = 0, flops_bwd = 0, flops_recompute = 0;
  Communication communication{};  // one rank's, per optimizer step (data parallelism)
  bool checked_valid = false;

  // Arena bytes of a tier: what a trainer allocates.
  constexpr std::int64_t peak_bytes(Tier t = Tier::device) const { return peak[static_cast<int>(t)]; }
  // Max over events of the bytes alive: no packing can do better.
  constexpr std::int64_t lower_bound(Tier t = Tier::device) const { return bound[static_cast<int>(t)]; }
  constexpr int lower_bound_event(Tier t = Tier::device) const { return bound_at[static_cast<int>(t)]; }
  // No two buffers alive at one event overlap, all inside their arena,
  // aligned: checked when the plan was made, independently of the packer.
  constexpr bool valid() const { return checked_valid; }
  // The same check, recomputed from this plan's arrays (slow in constant
  // evaluation for large plans: meant for run-time tests).
  constexpr bool recheck() const { return detail::recheck(buffers, peak, static_cast<int>(NE)); }

  // Sum of the reserved bytes of every buffer of a role (all instances), in
  // one tier or in both.
  constexpr std::int64_t bytes(Role r) const { return bytes(r, Tier::device) + bytes(r, Tier::offload); }
  constexpr std::int64_t bytes(Role r, Tier t) const {
    std::int64_t s = 0;
    for (const auto& b : buffers)
      if (b.role == r && b.tier == t) s += b.size;
    return s;
  }
  // Bytes of a role alive at event e.
  constexpr std::int64_t bytes_at(Role r, int e, Tier t = Tier::device) const {
    std::int64_t s = 0;
    for (const auto& b : buffers)
      if (b.role == r && b.tier == t && b.alive_at(e)) s += b.size;
    return s;
  }
  constexpr std::int64_t parameters() const {
    std::int64_t n = 0;
    for (const auto& p : params) n += p.rows * p.cols * p.instances;
    return n;
  }
  constexpr std::int64_t trainable_parameters() const {
    std::int64_t n = 0;
    for (const auto& p : params)
      if (p.trainable) n += p.rows * p.cols * p.instances;
    return n;
  }
  constexpr std::size_t event_count() const { return NE; }
  constexpr std::int64_t flops() const { return flops_fwd + flops_bwd + flops_recompute; }
};

constexpr bool detail::Expanded::recheck() const {
  return detail::recheck(buffers, peak, static_cast<int>(events.size()));
}

// The same plan computed at run time, in growable arrays (members named as
// in Plan: buffers, events, nodes, params, peak, lower_bound, valid, ...):
// for tools that explore many configurations without paying compile time
// for each. Keep the result non-const, so the compiler does not try to
// evaluate it at compile time.
using RuntimePlan = detail::Expanded;
template <TrainingRun R>
RuntimePlan plan_at_run_time() {
  static_assert(R::config().stage >= 0,
                "plan_at_run_time<Run>: a pipelined run is planned stage by stage: plan_at_run_time<pipeline_stage<Run, s>>()");
  return detail::expand<R>();
}

namespace detail {
template <TrainingRun R>
constexpr auto plan_of() {
  constexpr detail::Sizes n = detail::sizes<R>();
  HEADROOM_REQUIRE(n.trainable > 0 || n.parameters == 0,
                   "Train<Model, ...>: the optimizer has nothing to train: the model has {} trainable parameters of {}",
                   n.trainable, n.parameters);
  HEADROOM_REQUIRE(!n.tied_table_missing,
                   "Train<Model, PipelineParallel<{}>>: the LM head is tied to the embedding table, which stage {} does not hold; "
                   "a model with its own build() declares the table on the last stage (b.declare<Embedding<Vocab, D>>(name), as "
                   "Sequential and models::GPT2 do)",
                   R::config().pp, R::config().stage);
  const detail::Expanded x = detail::expand<R>();
  Plan<n.buffers, n.events, n.nodes, n.params> p{};
  p.config = x.cfg;
  for (std::size_t i = 0; i < n.buffers; ++i) p.buffers[i] = x.buffers[i];
  for (std::size_t i = 0; i < n.events; ++i) p.events[i] = x.events[i];
  for (std::size_t i = 0; i < n.nodes; ++i) p.nodes[i] = x.nodes[i];
  for (std::size_t i = 0; i < n.params; ++i) p.params[i] = x.params[i];
  for (int t = 0; t < tier_count; ++t) {
    p.peak[t] = x.peak[t];
    p.bound[t] = x.lower_bound[t];
    p.bound_at[t] = x.bound_event[t];
  }
  p.flops_fwd = x.flops_fwd;
  p.flops_bwd = x.flops_bwd;
  p.flops_recompute = x.flops_recompute;
  p.communication = x.communication;
  p.checked_valid = x.valid;
  return p;
}

// Pipeline parallelism: the stage whose device peak is the largest (the first, on a tie).
template <class R, int... S>
constexpr int largest_stage(std::integer_sequence<int, S...>) {
  const std::int64_t peaks[] = {plan_of<pipeline_stage<R, S>>().peak_bytes()...};
  int worst = 0;
  for (int s = 1; s < static_cast<int>(sizeof...(S)); ++s)
    if (peaks[s] > peaks[worst]) worst = s;
  return worst;
}
}  // namespace detail

// The plan of one training step of run R, for one process: with data or
// tensor parallelism one rank's; with pipeline parallelism the plan of the
// stage with the largest peak (plan<pipeline_stage<R, s>>() is stage s's),
// so that a bound on it holds on every process.
template <TrainingRun R>
constexpr auto plan() {
  if constexpr (R::config().stage >= 0)
    return detail::plan_of<R>();
  else
    return detail::plan_of<pipeline_stage<R, detail::largest_stage<R>(std::make_integer_sequence<int, R::config().pp>{})>>();
}

}  // namespace headroom
