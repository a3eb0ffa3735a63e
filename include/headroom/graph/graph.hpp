#pragma once
// The step graph: what a layer's `build` writes, and what the planner reads.
//
// A layer describes itself by calling a Builder (graph/builder.hpp) in
// constexpr code: it declares parameters, opens child scopes, and emits ops.
// An op names the tensors it reads, the tensors it writes, the tensors its
// backward needs again (saved), its scratch and its FLOPs. From the ops in
// forward order StepBuilder (graph/backward.hpp) derives the whole timeline
// of a step: forward events, the loss, backward events in reverse (with
// recompute for checkpointed segments, graph/recompute.hpp, and offload /
// prefetch for offloaded ones, graph/offload.hpp), the collectives of a
// sharded run (graph/sharding.hpp) and the optimizer update, and records for
// every tensor the events where it is born and used. Each builder adds its
// steps to the one below it:
//
//   Graph        the records and the recording steps (this header)
//   Sharding     ZeRO gathers, parameter fetches, gradient collectives
//   Builder      the layers' interface: scopes, parameters, ops, segments, groups
//   Offload      an Offloaded segment's copies out and back
//   Recompute    a Checkpointed segment's forward again
//   StepBuilder  finish(): backward and update
//
// Repeat<N, Block> builds its block once, as a *group*: the group's events and
// tensors stand for N instances, and an endpoint says which instance it
// refers to (the same one, the next one, a fixed one). The planner expands
// groups arithmetically, so a 32-layer model costs one block to describe.
#include <cstdint>
#include <string_view>

#include "../core/cvec.hpp"
#include "../core/dtype.hpp"
#include "../core/param_init.hpp"
#include "../core/quant_format.hpp"
#include "../core/workspace.hpp"
#include "operands.hpp"
#include "roles.hpp"
#include "run_config.hpp"
#include "tensor_split.hpp"

namespace headroom {
namespace graph {

inline constexpr int none = -1;
inline constexpr int all_instances = -3;  // Endpoint::abs: every instance of the event's group
inline constexpr int not_last = -2;       // Endpoint::only: every instance but the group's last

// A reference to a tensor: its id, and for a tensor of a group used outside
// the group, the one instance meant (a Repeat's output is its last instance).
struct Ref {
  int id = none;
  int fixed = none;
  constexpr bool valid() const { return id != none; }
  constexpr bool operator==(const Ref&) const = default;
};

struct Node {
  std::string_view name;  // slot name given by the parent ("q_proj", "layers")
  std::string_view kind;  // layer kind ("Linear", "LoRA")
  int parent = none;
  int index = none;       // position in a Sequential, or none
  int group = none;       // the Repeat group it belongs to
  int repeat = 1;         // for the node of a Repeat: its count
  int first_instance = 0; // pipeline parallelism: the model's block index of this stage's instance 0
};

struct Tensor {
  std::string_view name;
  int node = none;
  Role role = Role::activation;
  Tier tier = Tier::device;
  std::int64_t bytes = 0;
  int group = none;
  bool persistent = false;  // lives the whole step
  bool collapsed = false;   // one buffer for all instances of its group
  int alias = none;         // this tensor is another one (same buffer)
  // A Repeat's block input: instance 0 is `outer`, instance j>0 is instance
  // j-1 of `prev`. Endpoints recorded on it are forwarded to those.
  bool is_virtual = false;
  Ref outer{};
  int prev = none;
};

// "Instance j of `tensor` is born at / used at event `event` of instance ...":
//   only >= 0: applies to tensor instance `only` alone; not_last: all but the last
//   abs >= 0: that instance of the event's group; all_instances: every one
//   otherwise: instance j + rel.
struct Endpoint {
  int tensor = none;
  int event = none;
  int rel = 0;
  int abs = none;
  int only = none;
  bool birth = false;
};

struct Event {
  EventKind kind = EventKind::forward;
  int node = none;
  int group = none;
  int op = none;          // the op it runs, for forward / backward / recompute
  int collective = none;  // the collective it runs (Graph::collectives), for a collective event
};

struct Param {
  std::string_view name;
  int node = none;
  std::int64_t rows = 0, cols = 0;
  bool trainable = true;
  QuantDesc quant{};
  ParamInit init{};  // how its values start (by its name, unless its layer said)
  int group = none;
  int weight = none, scales = none, master = none, grad = none, state = none;
  int grad_shard = none;  // ZeRO 2 and 3: this rank's shard of the averaged gradient (grad is then the bucket)
  // OffloadOptimizer: the gradient in the offload tier, written when the
  // device's (grad) is complete and read by the update; grad then lives
  // only from its first writer to that copy
  int host_grad = none;
  TensorSplit split{};    // tensor parallelism: which block of the whole this rank holds (rows, cols: its own)
  // pipeline parallelism: held by the first and the last stage (an LM head
  // tied to the embedding table); the engines sum its gradient over the two
  // before the update, so both update it alike
  bool stage_shared = false;
  // tensor parallelism: held whole by every rank of the group, each of
  // which computes a partial sum of its gradient (a LoRA adapter matrix
  // beside a split projection, policies/lora.hpp); the engines sum it over
  // the group before the update
  bool tensor_partial = false;
  constexpr std::int64_t elements() const { return rows * cols; }
};

// OffloadOptimizer on the CUDA engine: a gradient that several processes
// sum before the update (Param::stage_shared, Param::tensor_partial) stays
// in its device buffer for the whole step, as without offload, because the
// collective that sums it reads device memory; after the backward the
// engine sums it there and then copies it to the offload tier. (The host
// engine sums the offload tier's copy.) P: graph::Param or ParamSlot.
template <class P>
constexpr bool offloaded_after_sum(const RunConfig& c, const P& p) {
  return c.offload_optimizer && c.cuda() && (p.stage_shared || (p.tensor_partial && c.tp > 1));
}

// What an op's kernels exchange each time its event runs: over its
// tensor-parallel group (ops/tensor_parallel.hpp; the vocabulary-parallel LM
// head), payload bytes and calls; with the pipeline's neighbouring stages
// (ops/pipeline.hpp), bytes sent and received.
struct Exchange {
  std::int64_t all_reduce = 0, all_gather = 0;
  std::int64_t all_reduce_calls = 0, all_gather_calls = 0;
  std::int64_t sent = 0, received = 0;
};

inline constexpr int max_in = 3, max_out = 3, max_saved = 6, max_grads = 4, max_dims = 10, max_weights = 2,
                           max_epilogues = 4;

// One op of the step: what it reads, writes and keeps for backward, with its
// FLOPs and scratch. `kind` is the name of the op type that runs it (ops/,
// e.g. ops::Linear::name == "linear"); the engines find that type among the
// ops the model's layers list (ops_of<Model>) and run its kernels. Operands
// are bound by name through the op type's tags (graph/operands.hpp):
//   op.input(Linear::x, x);  op.output(Linear::y, y);  op.set(Linear::in, In);
struct Op {
  int node = none;
  int group = none;
  int event = none;  // its forward (or loss) event
  Ref in[max_in]{};
  bool in_grad[max_in]{};   // backward writes the gradient of this input
  bool in_alias[max_in]{};  // ... into the gradient of out[0] itself (residual add)
  int n_in = 0;
  Ref out[max_out]{};
  int n_out = 0;
  Ref inout{};               // a tensor it updates in place (LoRA adds into the base output)
  Ref saved[max_saved]{};    // what backward reads again
  int n_saved = 0;
  int grads[max_grads]{};    // gradient tensors of parameters its backward writes
  int n_grads = 0;
  std::int64_t scratch_fwd = 0, scratch_bwd = 0;
  std::int64_t flops_fwd = 0, flops_bwd = 0;
  Exchange exchange_fwd{}, exchange_bwd{};  // with other ranks: forward (and recompute, loss), backward
  bool fused_loss = false;   // forward computes loss and input gradient in one pass
  std::string_view kind{};   // the op type's name
  ops::Lane lane = ops::Lane::compute;
  // Epilogue fusion (ops/epilogue.hpp), from the op types: the ops this
  // op's kernels compute in their epilogue, by name (a linear: GELU,
  // SwiGLU), and, for an op a producer computes so, the input that
  // producer's output feeds (none: it always runs its own kernel).
  std::string_view epilogues[max_epilogues]{};
  int epilogue_input = none;
  int param[max_weights] = {none, none};  // the parameters it reads (ops::Weight<i>)
  std::int64_t dim[max_dims]{};           // its dimensions (ops::Dim<i>)

  // ---- binding operands by name -----------------------------------------------
  // An input; backward writes its gradient unless `grad` is false; `alias`:
  // that gradient is the gradient of out[0] itself (a residual add).
  template <int I>
  constexpr void input(ops::In<I>, Ref r, bool grad = true, bool alias = false) {
    static_assert(I < max_in, "graph::Op: at most max_in inputs");
    in[I] = r;
    in_grad[I] = grad;
    in_alias[I] = alias;
    if (n_in <= I) n_in = I + 1;
  }
  template <int I>
  constexpr void output(ops::Out<I>, Ref r) {
    static_assert(I < max_out, "graph::Op: at most max_out outputs");
    out[I] = r;
    if (n_out <= I) n_out = I + 1;
  }
  constexpr void update(ops::InOut, Ref r) { inout = r; }
  template <int I>
  constexpr void save(ops::Saved<I>, Ref r) {
    static_assert(I < max_saved, "graph::Op: at most max_saved saved tensors");
    saved[I] = r;
    if (n_saved <= I) n_saved = I + 1;
  }
  template <int I>
  constexpr void set(ops::Dim<I>, std::int64_t v) {
    static_assert(I < max_dims, "graph::Op: at most max_dims dimensions");
    dim[I] = v;
  }
  // Reads parameter `index` (b.param / b.matrix / b.adapter); `grad`: the
  // parameter's gradient tensor its backward writes (none when frozen).
  template <int I>
  constexpr void use(ops::Weight<I>, int index, int grad) {
    static_assert(I < max_weights, "graph::Op: at most max_weights parameters");
    param[I] = index;
    if (grad != none) grads[n_grads++] = grad;
  }
  template <int I>
  constexpr std::int64_t operator[](ops::Dim<I>) const { return dim[I]; }
};

// The tensors one event reads and writes, slot by slot, as the engine binds
// them: for a forward event the op's own; for a recompute the recomputed
// copies (inout only when the base output itself was recomputed); for a
// backward the saved tensors as backward sees them (recomputed or
// prefetched), the gradients of the outputs and the gradients of the inputs
// (none where the input's gradient *is* the output's: a residual add).
struct Binding {
  Ref in[max_in]{};
  Ref out[max_out]{};
  Ref inout{};
  Ref saved[max_saved]{};
  Ref d_out[max_out]{};
  Ref d_inout{};
  Ref d_in[max_in]{};
  int scratch = none;  // its scratch tensor
  int segment = none;  // offload / prefetch: the segment it copies
  // ZeRO 3: the parameters this event reads, gathered from their shards
  // (dense values or quantized codes, and the scales of a quantized one),
  // in place of the shards themselves.
  Ref weight[max_weights]{};
  Ref scales[max_weights]{};
};

// One activation an Offloaded segment moves: src is copied to host (offload
// tier) by the segment's offload event, host back to dev by its prefetch.
struct Copy {
  int segment = none;
  int src = none, host = none, dev = none;
};

struct Segment {
  int first_op = 0, end_op = 0;  // [first, end) in op order
  int node = none;
  int group = none;
  bool checkpoint = false;
  bool offload = false;
  int offload_event = none;
  Ref input{};
};

struct Group {
  int count = 1;
  int node = none;
  int first_op = 0, end_op = 0;
  Ref input{};            // the tensor fed to instance 0
  int placeholder = none; // the block's virtual input
  int output = none;      // the block's output tensor (grouped)
};

// The step graph as recorded: every node, tensor, event (with the tensors
// it binds) and endpoint, and the recording steps the builders share. The
// planner reads a finished Graph (plan/plan.hpp: build_graph); the layers
// write one through Builder (graph/builder.hpp), and StepBuilder
// (graph/backward.hpp) completes it with the backward and the update.
class Graph {
 public:
  RunConfig cfg{};
  detail::cvec<Node> nodes;
  detail::cvec<Tensor> tensors;
  detail::cvec<Endpoint> endpoints;
  detail::cvec<Event> events;
  detail::cvec<Param> params;
  detail::cvec<Op> ops;
  detail::cvec<Segment> segments;
  detail::cvec<Group> groups;
  detail::cvec<Binding> bindings;  // per event
  detail::cvec<Copy> copies;
  detail::cvec<Op> collectives;    // the data-parallel collectives, one per collective event
  Ref tokens{}, targets{}, loss{};
  // The model's vocabulary: the token ids it reads (the embedding) and
  // predicts (the LM head) lie in [0, vocab), whole over the tensor-parallel
  // ranks. Set by the ops that read or predict them; 0 where none does (a
  // pipeline stage between the first and the last).
  std::int64_t vocab = 0;
  int gemm_workspace = none;  // the workers' GEMM packing panels (GemmBlocking)
  int update_staging = none;  // OffloadOptimizer on the host engine: one update range per worker in RAM (RunConfig::update_staging_bytes)
  std::int64_t update_range = 0;  // ... of so many elements: the most a process updates of one parameter, at most RunConfig::update_chunk
  int tied_weight = none;  // the embedding table an LM head may share
  bool tied_table_missing = false;  // a tied LM head built on a stage without the table (plan<Run>() refuses it)
  // tensor parallelism: set by a layer (LoRA) that adds to a row-parallel
  // projection's partial output before it is summed: the projection then
  // returns its partial output without the sum and declares its bias
  // (deferred_bias, none without); the layer emits the tp_output after its op
  bool defer_tp_output = false;
  int deferred_bias = none;
  int quant_table = none, optim_table = none;
  int reductions = none;   // CUDA: gradient-norm partials and the update's control block (CudaWorkspace)
  int staging = none;      // CUDA: the step's pinned host staging (offload tier)

  constexpr explicit Graph(RunConfig c) : cfg(c) {
    nodes.push_back(Node{"model", "Model", none, none, none, 1});
    events.push_back(Event{EventKind::load_batch, 0, none, none});
    bindings.push_back(Binding{});
  }

  // How many times the ops of `group` run in a step: its count (Repeat's
  // blocks), or once outside any group (none).
  constexpr int instances(int group) const { return group == none ? 1 : groups[group].count; }
  constexpr std::int64_t tokens_count() const { return cfg.tokens(); }
  constexpr std::int64_t act(std::int64_t features) const { return cfg.tokens() * features * cfg.act_bytes(); }
  constexpr int current_group() const { return group_stack_.empty() ? none : group_stack_.back(); }
  constexpr int current_node() const { return node_stack_.empty() ? 0 : node_stack_.back(); }

  // ---- tensors ---------------------------------------------------------------
  constexpr int new_tensor(std::string_view name, Role role, std::int64_t bytes, int group, Tier tier = Tier::device) {
    Tensor t{};
    t.name = name;
    t.node = current_node();
    t.role = role;
    t.tier = tier;
    t.bytes = bytes;
    t.group = group;
    tensors.push_back(t);
    return static_cast<int>(tensors.size()) - 1;
  }

  constexpr int persistent(std::string_view name, Role role, std::int64_t bytes, int group, Tier tier = Tier::device) {
    int t = new_tensor(name, role, bytes, group, tier);
    tensors[t].persistent = true;
    return t;
  }

  constexpr int grad_of(int t) const { return t < static_cast<int>(grad_of_.size()) ? grad_of_[t] : none; }

 protected:
  detail::cvec<int> node_stack_;
  detail::cvec<int> group_stack_;
  detail::cvec<int> grad_of_;
  detail::cvec<int> remap_;        // checkpoint / offload: tensor -> copy used by backward

  // ---- recording -------------------------------------------------------------
  constexpr int push_event(EventKind k, int node, int group) {
    events.push_back(Event{k, node, group, none});
    bindings.push_back(Binding{});
    return static_cast<int>(events.size()) - 1;
  }

  constexpr void add_endpoint(int t, int e, int rel, int abs, int only, bool birth) {
    endpoints.push_back(Endpoint{t, e, rel, abs, only, birth});
  }

  // Records a reference at event e, translating between the tensor's group
  // and the event's.
  constexpr void mark(Ref r, int e, bool birth) {
    const int tg = tensors[r.id].group;
    const int eg = events[e].group;
    if (r.fixed != none) {
      add_endpoint(r.id, e, 0, eg == none ? 0 : all_instances, r.fixed, birth);
    } else if (tg == eg) {
      add_endpoint(r.id, e, 0, none, none, birth);
    } else if (eg == none) {
      // every instance of a group's tensor, at one ungrouped event (the update)
      add_endpoint(r.id, e, 0, 0, none, birth);
    } else {
      // an outer tensor read by every instance of a group
      add_endpoint(r.id, e, 0, all_instances, none, birth);
    }
  }

  constexpr void use(Ref r, int e) { mark(r, e, false); }
  constexpr void born(Ref r, int e) { mark(r, e, true); }

  constexpr void scratch(std::string_view name, std::int64_t bytes, int e) {
    const int t = new_tensor(name, Role::scratch, bytes, events[e].group);
    tensors[t].node = events[e].node;
    add_endpoint(t, e, 0, none, none, true);
    bindings[e].scratch = t;
  }

  constexpr void grow(int t) {
    while (static_cast<int>(remap_.size()) <= t + 1) remap_.push_back(none);
    while (static_cast<int>(grad_of_.size()) <= t + 1) grad_of_.push_back(none);
  }
};

}  // namespace graph
}  // namespace headroom
