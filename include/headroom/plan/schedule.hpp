#pragma once
// The schedule of a step: the plan turned into what an engine executes.
//
//   constexpr auto s = headroom::schedule<Run>();
//
// One Step per event of the plan's timeline, in order, each naming the op it
// runs (its op type's name and dimensions) and every tensor it touches as a byte offset
// into its tier's arena, slot by slot (graph::Binding): inputs, outputs, the
// saved tensors backward reads (already redirected to recomputed or
// prefetched copies), gradients of outputs and inputs, parameters, scratch.
// A slot also says whether this event is the first to write its buffer: the
// engine overwrites it there and accumulates everywhere else (gradients of a
// tensor read by several ops, parameter gradients over micro-batches).
//
// The schedule is a constexpr value computed from the run type, with the
// offsets of plan<Run>() (a trainer, which holds the plan, builds it from
// that plan: detail::schedule_of_plan); an engine walks it and calls one
// kernel per step, so nothing about the graph is decided at run time.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "plan.hpp"

namespace headroom {

// A tensor as one event sees it.
struct Slot {
  std::int64_t offset = -1;  // in the arena of its tier; -1: not bound
  std::int64_t bytes = 0;
  bool first = false;        // this event writes the buffer first (overwrite, don't accumulate)
  // Pipeline parallelism: bytes between the copies of a buffer kept per
  // micro-batch in flight (copy c at offset + c stride); 0: one copy.
  std::int64_t stride = 0;
  int copies = 1;
  constexpr bool bound() const { return offset >= 0; }
  // the bytes it spans, every copy
  constexpr std::int64_t extent() const { return stride > 0 ? stride * copies : bytes; }
};

// One instance of one parameter, and where its buffers live (device tier;
// with OffloadOptimizer master, state and host_grad in the offload tier).
struct ParamSlot {
  std::string_view name;  // "weight", "lora_A", ...
  int param = -1;         // index into plan.params / graph params
  int node = -1;
  int instance = 0;       // its Repeat instance
  std::int64_t rows = 0, cols = 0;
  bool trainable = false;
  QuantDesc quant{};
  ParamInit init{};  // how its values start (graph::Param::init)
  std::int64_t weight = -1, scales = -1, master = -1, grad = -1, state = -1;
  // Data parallelism: elements of one rank's shard (RunConfig::shard), and
  // with ZeRO 2 and 3 this rank's shard of the averaged gradient (`grad` is
  // then the bucket backward fills).
  std::int64_t shard = 0;
  std::int64_t grad_shard = -1;
  // OffloadOptimizer: the gradient's copy in the offload tier, which the
  // update reads; master and state are then offsets in that tier too.
  std::int64_t host_grad = -1;
  // Tensor parallelism: the block of the whole this rank holds (rows, cols are the block's).
  TensorSplit split{};
  // Pipeline parallelism: also held by the first or the last stage, whose
  // gradient of it is added to this one's before the update (graph::Param::stage_shared).
  bool stage_shared = false;
  // Tensor parallelism: whole on every rank of the group, each computing a
  // partial sum of its gradient, summed over the group before the update (graph::Param::tensor_partial).
  bool tensor_partial = false;
  constexpr std::int64_t elements() const { return rows * cols; }
};

// A copy between tiers made by an offload (device -> offload), a prefetch
// (offload -> device) or a fetch (parameters, offload -> device) step.
struct CopyStep {
  std::int64_t from = -1, to = -1, bytes = 0;
  // Pipeline parallelism: bytes between the offload tier's copies of the
  // buffer, one per micro-batch in flight (Slot::stride; its `to` for an
  // offload, its `from` for a prefetch); 0: one copy.
  std::int64_t host_stride = 0;
  constexpr std::int64_t host_at(int copy) const { return copy * host_stride; }
};

struct Step {
  EventKind kind = EventKind::forward;
  std::string_view op{};  // the op type's name (ops::Linear::name, ...); empty for events without an op
  ops::Lane lane = ops::Lane::compute;
  int op_index = -1;  // graph op id
  int node = -1;
  int instance = 0;
  std::int64_t dim[graph::max_dims]{};
  Slot in[graph::max_in]{}, out[graph::max_out]{}, inout{};
  Slot saved[graph::max_saved]{};
  Slot d_out[graph::max_out]{}, d_inout{}, d_in[graph::max_in]{};
  Slot scratch{};
  int param[graph::max_weights] = {-1, -1};             // ParamSlot indices
  // ZeRO 3: the parameters as gathered for this event (values or codes, and
  // scales), read in place of the ParamSlot's shards; unbound otherwise.
  Slot weight[graph::max_weights]{}, scales[graph::max_weights]{};
  // The gradient buffers of the parameters this event writes (backward, and
  // the loss event of a fused loss), as slots: what another lane's op must
  // not touch meanwhile (a gradient bucket's bytes are reused once reduced).
  Slot param_grad[graph::max_weights]{};
  bool grad_first[graph::max_weights] = {false, false}; // this event writes that parameter's gradient first
  // OffloadOptimizer with Accumulate<K>: before this event, the first to
  // write that parameter's device gradient in a micro-batch (with ZeRO 2
  // and 3: its reduce-scatter, writing this rank's shard), the engine fills
  // it with the offload tier's sum so far (zeros in the first micro-batch),
  // and the event adds to it (grad_first / the shard's slot's first is
  // false): the sum is formed in the same order as on the device alone.
  bool grad_load[graph::max_weights] = {false, false};
  int copy_begin = 0, copy_end = 0;    // offload / prefetch / fetch: its CopySteps
  // UpdateInBackward: parameters whose gradients are complete after this
  // step; OffloadOptimizer: whose gradients this step's end copies to the
  // offload tier (sched.updates[update_begin, update_end))
  int update_begin = 0, update_end = 0;
  // Fusion: an op whose output the next step reads right away, where this
  // op lists the next one among its epilogues (ops/epilogue.hpp), computes
  // it there (fuse_next); the next step's own kernel then does not run
  // (fused_into_previous).
  bool fuse_next = false;
  bool fused_into_previous = false;
  // ZeRO 3: a gather whose buffers the plan has alive from an earlier step
  // (the op before it): the engine may issue it before that step, so the
  // communication overlaps it (a prefetch one op ahead); with
  // OffloadParameters the fetch of the shards it gathers, which comes before
  // it, likewise. -1: at its place.
  int issue_before = -1;
};

template <std::size_t NS, std::size_t NC, std::size_t NP>
struct Schedule {
  RunConfig config{};
  std::array<Step, NS> steps{};
  std::array<CopyStep, NC> copies{};
  std::array<ParamSlot, NP> params{};
  std::array<int, NP> updates{};  // ParamSlot indices, in the order UpdateInBackward runs them
  std::int64_t peak[tier_count]{};
  Slot tokens{}, targets{}, loss{};
  std::int64_t vocab = 0;  // the model's vocabulary (graph::Graph::vocab): 0 where no op reads or predicts token ids
  Slot gemm_panels{};             // the workers' GEMM packing panels (CUDA: the cuBLASLt workspace)
  Slot update_staging{};          // OffloadOptimizer on the host engine: one update range per worker (RunConfig::update_staging_bytes)
  std::int64_t update_range = 0;  // ... of so many elements (graph::Graph::update_range; 0 without that buffer)
  Slot reductions{};              // CUDA: gradient-norm partials and the update's control block
  Slot staging{};                 // CUDA: pinned host staging of the step (offload tier)
  std::int64_t quant_table = -1;  // NF4 code values (+ the dynamic map for double quantization)
  std::int64_t optim_table = -1;  // the optimizer's tables (AdamW8bit's two dynamic maps)
  int loss_step = -1, update_step = -1;
  int backward_step = -1;  // the first backward step: a micro-batch's forward is [1, backward_step)

  constexpr std::int64_t arena_bytes(Tier t = Tier::device) const { return peak[static_cast<int>(t)]; }
  // Bytes of the shared NF4 code tables in use: the most any quantized parameter needs.
  constexpr std::int64_t quant_table_bytes() const {
    std::int64_t bytes = 0;
    for (const ParamSlot& p : params)
      if (p.quant.table_bytes() > bytes) bytes = p.quant.table_bytes();
    return bytes;
  }
};

namespace detail {

// Finds buffers by (tensor, instance) and tensors by reference.
struct BufferIndex {
  const graph::Graph& b;
  const Expanded& x;
  cvec<int> first;  // per tensor: its first buffer, or -1

  constexpr BufferIndex(const graph::Graph& graph, const Expanded& expanded)
      : b(graph), x(expanded), first(graph.tensors.size(), -1) {
    for (int i = static_cast<int>(x.buffers.size()) - 1; i >= 0; --i) first[x.buffers[i].tensor] = i;
  }

  // The buffer a reference means for an event of instance j.
  constexpr int buffer(graph::Ref r, int j) const {
    int t = r.id;
    while (true) {
      if (b.tensors[t].alias != graph::none) t = b.tensors[t].alias;
      const graph::Tensor& tr = b.tensors[t];
      if (tr.is_virtual) {  // a Repeat's block input (or its gradient)
        if (j == 0) {
          r = tr.outer;
          t = r.id;
          j = 0;
        } else {
          r = graph::Ref{tr.prev, graph::none};
          t = tr.prev;
          j = j - 1;
        }
        continue;
      }
      int inst = 0;
      if (tr.collapsed || tr.group == graph::none) inst = 0;
      else if (r.fixed != graph::none) inst = r.fixed;
      else inst = j;
      const int k = first[t] + inst;
      if (first[t] < 0 || x.buffers[k].tensor != t) throw "schedule: a tensor has no buffer for this instance";
      return k;
    }
  }
  constexpr Slot slot(graph::Ref r, int j, int event) const {
    if (!r.valid()) return Slot{};
    const Buffer& buf = x.buffers[buffer(r, j)];
    return Slot{buf.offset, buf.bytes, buf.born == event, buf.copies > 1 ? align_up(buf.bytes, buf.align) : 0, buf.copies};
  }
  constexpr Slot slot_of_tensor(int t, int j, int event) const {
    if (t == graph::none) return Slot{};
    const graph::Tensor& tr = b.tensors[t];
    if (!tr.is_virtual && tr.alias == graph::none && first[t] < 0) return Slot{};  // no bytes, no buffer
    return slot(graph::Ref{t, graph::none}, j, event);
  }
};

template <class R>
consteval bool scheduled_by_stage() {
  static_assert(R::config().stage >= 0,
                "schedule<Run>: a pipelined run is scheduled stage by stage: schedule<pipeline_stage<Run, s>>() (host::Trainer of a "
                "stage: host::with_pipeline_stage)");
  return true;
}

// The schedule of R with the offsets of `plan`, which is plan<R>() (the
// same buffers in the same order; checked as it is read): a trainer, which
// holds the plan, does not pack the arena a second time.
template <class R, class P>
constexpr auto schedule_of_plan(const P& plan) {
  static_assert(scheduled_by_stage<R>());
  constexpr Sizes n = sizes_of<R>;
  const graph::Graph b = build_graph<R>();
  Expanded x = expand_graph<false>(b);
  if (x.buffers.size() != plan.buffers.size()) throw "schedule_of_plan<Run>(plan): the plan is not Run's";
  for (std::size_t i = 0; i < x.buffers.size(); ++i) {
    Buffer& buf = x.buffers[i];
    const Buffer& placed = plan.buffers[i];
    if (buf.tensor != placed.tensor || buf.tier != placed.tier || buf.size != placed.size || buf.first != placed.first ||
        buf.last != placed.last)
      throw "schedule_of_plan<Run>(plan): the plan is not Run's";
    buf.offset = placed.offset;
  }
  const Timeline tl = expand_events(b);
  const BufferIndex index(b, x);
  Schedule<n.events, n.copies, n.param_slots> s{};
  s.config = x.cfg;
  for (int t = 0; t < tier_count; ++t) s.peak[t] = plan.peak[t];

  // parameters: one slot per instance
  detail::cvec<int> param_base(b.params.size(), 0);
  {
    int k = 0;
    for (int p = 0; p < static_cast<int>(b.params.size()); ++p) {
      const graph::Param& pr = b.params[p];
      param_base[p] = k;
      const int count = b.instances(pr.group);
      for (int j = 0; j < count; ++j, ++k) {
        ParamSlot& ps = s.params[k];
        ps.name = pr.name;
        ps.param = p;
        ps.node = pr.node;
        ps.instance = j;
        ps.rows = pr.rows;
        ps.cols = pr.cols;
        ps.trainable = pr.trainable;
        ps.quant = pr.quant;
        ps.init = pr.init;
        ps.weight = index.slot_of_tensor(pr.weight, j, -1).offset;
        ps.scales = index.slot_of_tensor(pr.scales, j, -1).offset;
        ps.master = index.slot_of_tensor(pr.master, j, -1).offset;
        ps.grad = index.slot_of_tensor(pr.grad, j, -1).offset;
        ps.state = index.slot_of_tensor(pr.state, j, -1).offset;
        ps.grad_shard = index.slot_of_tensor(pr.grad_shard, j, -1).offset;
        ps.host_grad = index.slot_of_tensor(pr.host_grad, j, -1).offset;
        ps.shard = b.cfg.dp > 1 ? b.cfg.shard(pr.elements()) : pr.elements();
        ps.split = pr.split;
        ps.stage_shared = pr.stage_shared;
        ps.tensor_partial = pr.tensor_partial;
      }
    }
  }

  // steps
  int copy_at = 0;
  for (int e = 0; e < static_cast<int>(b.events.size()); ++e) {
    const graph::Event& ev = b.events[e];
    const graph::Binding& bd = b.bindings[e];
    for (int j = 0; j < tl.count[e]; ++j) {
      const int g = tl.at(e, j);
      Step& st = s.steps[g];
      st.kind = ev.kind;
      st.node = ev.node;
      st.instance = j;
      if (ev.kind == EventKind::loss) s.loss_step = g;
      if (ev.kind == EventKind::update) s.update_step = g;
      if (ev.kind == EventKind::backward && (s.backward_step < 0 || g < s.backward_step)) s.backward_step = g;
      if (ev.op != graph::none || ev.collective != graph::none) {
        const graph::Op& op = ev.op != graph::none ? b.ops[ev.op] : b.collectives[ev.collective];
        st.op = op.kind;
        st.lane = op.lane;
        st.op_index = ev.op;
        for (int d = 0; d < graph::max_dims; ++d) st.dim[d] = op.dim[d];
        for (int q = 0; q < graph::max_weights; ++q) {
          const int p = op.param[q];
          if (p == graph::none) continue;
          const graph::Param& pr = b.params[p];
          const int inst = pr.group == graph::none ? 0 : j;
          st.param[q] = param_base[p] + inst;
          // backward events, and the loss event of a fused loss, write gradients
          if (pr.grad != graph::none && ev.kind != EventKind::forward && ev.kind != EventKind::recompute &&
              ev.kind != EventKind::collective) {
            st.param_grad[q] = index.slot_of_tensor(pr.grad, inst, g);
            st.grad_first[q] = st.param_grad[q].first;
            // (ZeRO 2 and 3: the shard the reduce-scatter writes, below; the bucket starts anew)
            if (b.cfg.offload_optimizer && b.cfg.accumulate > 1 && !b.cfg.sharded(2) && st.grad_first[q] &&
                !graph::offloaded_after_sum(b.cfg, pr)) {
              st.grad_first[q] = false;
              st.grad_load[q] = true;
            }
          }
        }
      }
      for (int q = 0; q < graph::max_in; ++q) {
        st.in[q] = index.slot(bd.in[q], j, g);
        st.d_in[q] = index.slot(bd.d_in[q], j, g);
      }
      for (int q = 0; q < graph::max_out; ++q) {
        st.out[q] = index.slot(bd.out[q], j, g);
        st.d_out[q] = index.slot(bd.d_out[q], j, g);
      }
      for (int q = 0; q < graph::max_saved; ++q) st.saved[q] = index.slot(bd.saved[q], j, g);
      for (int q = 0; q < graph::max_weights; ++q) {
        st.weight[q] = index.slot(bd.weight[q], j, g);
        st.scales[q] = index.slot(bd.scales[q], j, g);
      }
      // ZeRO 3's gathers may start as early as their buffers are born (with
      // OffloadParameters, the fetches of the shards they gather with them)
      if ((ev.kind == EventKind::collective && st.op == graph::collective::AllGatherParams::name) ||
          (ev.kind == EventKind::fetch && b.cfg.sharded(3))) {
        int earliest = g;
        for (int q = 0; q < graph::max_out; ++q)
          if (bd.out[q].valid()) earliest = std::min(earliest, x.buffers[index.buffer(bd.out[q], j)].first);
        if (earliest < g) st.issue_before = earliest;
      }
      // OffloadOptimizer with ZeRO 2 and 3 and Accumulate<K>: this rank's
      // gradient shard starts from the offload tier's sum, and the
      // reduce-scatter adds to it (its running sum joins its block)
      if (b.cfg.offload_optimizer && b.cfg.accumulate > 1 && ev.kind == EventKind::collective &&
          st.op == graph::collective::ReduceScatterGrads::name)
        for (int q = 0; q < graph::max_weights; ++q)
          if (st.out[q].bound() && st.out[q].first) {
            st.out[q].first = false;
            st.grad_load[q] = true;
          }
      st.inout = index.slot(bd.inout, j, g);
      st.d_inout = index.slot(bd.d_inout, j, g);
      st.scratch = index.slot_of_tensor(bd.scratch, j, g);
      // tier copies
      st.copy_begin = st.copy_end = copy_at;
      if (bd.segment != graph::none && (ev.kind == EventKind::offload || ev.kind == EventKind::prefetch)) {
        const int inst = ev.kind == EventKind::offload ? j : x.events[g].fetches;
        if (inst >= 0) {
          for (const graph::Copy& c : b.copies) {
            if (c.segment != bd.segment) continue;
            const Slot from = ev.kind == EventKind::offload ? index.slot_of_tensor(c.src, inst, -1)
                                                            : index.slot_of_tensor(c.host, inst, -1);
            const Slot to = ev.kind == EventKind::offload ? index.slot_of_tensor(c.host, inst, -1)
                                                          : index.slot_of_tensor(c.dev, inst, -1);
            s.copies[copy_at++] =
                CopyStep{from.offset, to.offset, from.bytes, ev.kind == EventKind::offload ? to.stride : from.stride};
          }
        }
        st.copy_end = copy_at;
      }
      if (ev.kind == EventKind::fetch) {  // the parameters, from the offload tier to their device copies
        for (int q = 0; q < graph::max_out; ++q) {
          if (!bd.out[q].valid()) continue;
          const Slot from = index.slot(bd.in[q], j, g), to = index.slot(bd.out[q], j, g);
          s.copies[copy_at++] = CopyStep{from.offset, to.offset, from.bytes, 0};
        }
        st.copy_end = copy_at;
      }
    }
  }

  // Epilogues: a step whose op runs in the previous op's epilogue (GELU after
  // a linear; SwiGLU after up_proj, its gate already computed): the previous
  // op lists it, and it reads that op's output, in its epilogue input only
  auto lists = [&b](const Step& a, const Step& n) {
    if (a.op_index == graph::none || n.op_index == graph::none || b.ops[n.op_index].epilogue_input == graph::none) return false;
    for (std::string_view e : b.ops[a.op_index].epilogues)
      if (!e.empty() && e == n.op) return true;
    return false;
  };
  for (std::size_t g = 0; g + 1 < s.steps.size(); ++g) {
    Step& a = s.steps[g];
    Step& n = s.steps[g + 1];
    if (a.kind != EventKind::forward && a.kind != EventKind::recompute) continue;
    if (n.kind != a.kind || n.instance != a.instance || !a.out[0].bound() || !lists(a, n)) continue;
    const int input = b.ops[n.op_index].epilogue_input;
    bool fits = n.in[input].offset == a.out[0].offset;
    for (int q = 0; q < graph::max_in; ++q)
      if (q != input && n.in[q].bound() && n.in[q].offset == a.out[0].offset) fits = false;
    // The fused op's outputs are written one step before the plan has them
    // alive: only where they share no byte with what step g reads or writes
    // (a buffer that dies at step g is one that step g uses).
    auto overlaps = [](const Slot& x, const Slot& y) {
      return x.bound() && y.bound() && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
    };
    for (int o = 0; o < graph::max_out; ++o) {
      const Slot& w = n.out[o];
      for (int q = 0; q < graph::max_in; ++q) fits = fits && !overlaps(w, a.in[q]);
      for (int q = 0; q < graph::max_out; ++q) fits = fits && !overlaps(w, a.out[q]);
      for (int q = 0; q < graph::max_saved; ++q) fits = fits && !overlaps(w, a.saved[q]);
      fits = fits && !overlaps(w, a.inout) && !overlaps(w, a.scratch);
    }
    if (fits) {
      a.fuse_next = true;
      n.fused_into_previous = true;
    }
  }

  // tensors of the model
  s.tokens = index.slot(b.tokens, 0, 0);
  s.vocab = b.vocab;
  s.targets = index.slot(b.targets, 0, 0);
  s.loss = index.slot(b.loss, 0, s.loss_step);
  s.gemm_panels = index.slot_of_tensor(b.gemm_workspace, 0, -1);
  s.update_staging = index.slot_of_tensor(b.update_staging, 0, -1);
  s.update_range = b.update_range;
  s.reductions = index.slot_of_tensor(b.reductions, 0, -1);
  s.staging = index.slot_of_tensor(b.staging, 0, -1);
  s.quant_table = index.slot_of_tensor(b.quant_table, 0, -1).offset;
  s.optim_table = index.slot_of_tensor(b.optim_table, 0, -1).offset;

  // UpdateInBackward: each parameter's update runs right after the step
  // where its gradient buffer is last used; OffloadOptimizer: there the
  // gradient goes to the offload tier
  if (b.cfg.update_in_backward || b.cfg.offload_optimizer) {
    int at = 0;
    for (int g = 0; g < static_cast<int>(s.steps.size()); ++g) {
      s.steps[g].update_begin = at;
      for (int k = 0; k < static_cast<int>(s.params.size()); ++k) {
        const ParamSlot& ps = s.params[k];
        if (!ps.trainable) continue;
        const int buf = index.buffer(graph::Ref{b.params[ps.param].grad, graph::none}, ps.instance);
        if (x.buffers[buf].last == g) s.updates[at++] = k;
      }
      s.steps[g].update_end = at;
    }
  }
  return s;
}

}  // namespace detail

// The schedule of R (planned here: what plan<R>() computes, then the steps).
template <TrainingRun R>
constexpr auto schedule() {
  static_assert(detail::scheduled_by_stage<R>());
  return detail::schedule_of_plan<R>(detail::plan_of<R>());
}

namespace detail {
// FNV-1a, eight bytes at a time.
struct Fnv {
  std::uint64_t h = 14695981039346656037ull;
  constexpr void mix(std::int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<std::uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  constexpr void mix_config(const RunConfig& c) {
    for (char ch : c.optim.name) mix(ch);
    for (std::int64_t v : {c.batch, c.seq, std::int64_t(c.dtype), c.optim.state_bytes(256), std::int64_t(c.accumulate),
                           std::int64_t(c.update_in_backward), std::int64_t(c.workers), c.loss_chunk, std::int64_t(c.engine),
                           std::int64_t(c.dp), std::int64_t(c.zero), std::int64_t(c.tp), std::int64_t(c.pp), std::int64_t(c.stage),
                           std::int64_t(c.offload_optimizer), std::int64_t(c.offload_params)})
      mix(v);
  }
};
}  // namespace detail

// A 64-bit hash of a run's shape and layout, whatever its stage (the stages
// of a pipelined run compare it at start-up; each stage's processes then
// compare their schedule's fingerprint).
constexpr std::uint64_t fingerprint_of_run(RunConfig c) {
  c.stage = -1;
  detail::Fnv f;
  f.mix_config(c);
  return f.h;
}

// A 64-bit hash (FNV-1a) of a schedule: its run's shape, every step's op,
// dimensions and slots, every parameter's buffers and the arenas' sizes.
// Two programs built from the same run type (with the same headroom) have
// the same; the ranks of a data-parallel run compare theirs at start-up.
template <class S>
constexpr std::uint64_t fingerprint(const S& s) {
  detail::Fnv f;
  auto mix = [&f](std::int64_t v) { f.mix(v); };
  auto text = [&mix](std::string_view t) {
    mix(static_cast<std::int64_t>(t.size()));
    for (char c : t) mix(c);
  };
  auto slot = [&mix](const Slot& x) {
    mix(x.offset);
    mix(x.bytes);
    mix(x.first);
    mix(x.stride);
  };
  f.mix_config(s.config);
  for (const Step& st : s.steps) {
    mix(static_cast<std::int64_t>(st.kind));
    text(st.op);
    for (std::int64_t d : st.dim) mix(d);
    for (const Slot& x : st.in) slot(x);
    for (const Slot& x : st.out) slot(x);
    for (const Slot& x : st.saved) slot(x);
    for (const Slot& x : st.d_in) slot(x);
    for (const Slot& x : st.d_out) slot(x);
    slot(st.inout);
    slot(st.scratch);
    for (int p : st.param) mix(p);
  }
  for (const ParamSlot& p : s.params) {
    text(p.name);
    for (std::int64_t v : {p.rows, p.cols, p.weight, p.scales, p.master, p.grad, p.state, p.grad_shard, p.shard, p.host_grad})
      mix(v);
  }
  for (std::int64_t v : s.peak) mix(v);
  return f.h;
}

}  // namespace headroom
