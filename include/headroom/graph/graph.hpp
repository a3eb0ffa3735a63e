#pragma once
// The step graph: what a layer's `build` writes, and what the planner reads.
//
// A layer describes itself by calling a Builder in constexpr code: it declares
// parameters, opens child scopes, and emits ops. An op names the tensors it
// reads, the tensors it writes, the tensors its backward needs again (saved),
// its scratch and its FLOPs. From the ops in forward order the builder derives
// the whole timeline of a step: forward events, the loss, backward events in
// reverse (with recompute for checkpointed segments and offload / prefetch
// for offloaded ones) and the optimizer update, and records for every tensor
// the events where it is born and used.
//
// Repeat<N, Block> builds its block once, as a *group*: the group's events and
// tensors stand for N instances, and an endpoint says which instance it
// refers to (the same one, the next one, a fixed one). The planner expands
// groups arithmetically, so a 32-layer model costs one block to describe.
#include <cstdint>
#include <string_view>

#include "../core/bytes.hpp"
#include "../core/cvec.hpp"
#include "../core/dtype.hpp"
#include "../core/optim_state.hpp"
#include "../core/param_init.hpp"
#include "../core/quant_format.hpp"
#include "../core/workspace.hpp"
#include "operands.hpp"
#include "roles.hpp"
#include "tensor_split.hpp"

namespace headroom {

// The engine a run is planned for: the host (CPU) engine, or the CUDA engine
// (Train<..., OnCuda>). The model's tensors are the same; what the kernels
// need besides them (GEMM workspace, scratch) differs.
enum class Engine : std::uint8_t { host, cuda };

// Everything about a run that fixes memory and is not the model itself.
struct RunConfig {
  std::int64_t batch = 1;         // sequences per micro-batch
  std::int64_t seq = 1;           // tokens per sequence
  DType dtype = DType::F32;       // storage of weights, grads and activations
  OptimDesc optim{};              // optimizer state per trainable element
  int accumulate = 1;             // micro-batches per optimizer step
  bool update_in_backward = false;
  // ZeRO-Offload (OffloadOptimizer): optimizer state, master weights and
  // gradients in the offload tier, updated by the host
  bool offload_optimizer = false;
  // ZeRO-Infinity's parameter offload (OffloadParameters): the parameters
  // too, fetched into device buffers for each event that reads them
  bool offload_params = false;
  int workers = 1;                // threads / CTAs that own a private scratch tile
  std::int64_t loss_chunk = 256;  // tokens per LM-head + cross-entropy chunk
  std::int64_t alignment = 256;   // every buffer starts on this boundary
  Engine engine = Engine::host;   // the kernels the scratch and workspace are sized for
  int dp = 1;                     // data-parallel ranks (DataParallel<N>); the plan is one rank's
  int zero = 0;                   // ZeRO stage over them: 1 optimizer states, 2 + gradients, 3 + parameters
  int tp = 1;                     // tensor-parallel ranks (TensorParallel<N>); the plan is one rank's
  int pp = 1;                     // pipeline stages (PipelineParallel<S>); the plan is one stage's
  int stage = 0;                  // the stage planned, 0 .. pp - 1 (-1: a pipelined run type before its stage is chosen)

  constexpr std::int64_t tokens() const { return batch * seq; }
  // Processes of the run: pipeline stages of data-parallel groups of tensor-parallel ranks.
  constexpr int world() const { return pp * dp * tp; }
  // Pipeline parallelism: the stage holds the layers before the model's
  // Repeat (first stage), its share of the Repeat's blocks, the layers after
  // it (last stage); micro-batches in flight at once on this stage under 1F1B
  // (its forward activations live until its backward: so many copies).
  constexpr bool first_stage() const { return stage <= 0; }
  constexpr bool last_stage() const { return stage < 0 || stage == pp - 1; }
  constexpr int in_flight() const { return pp <= 1 ? 1 : (pp - stage < accumulate ? pp - stage : accumulate); }
  // Whether the data-parallel ranks shard what ZeRO stage `stage` shards.
  constexpr bool sharded(int stage) const { return dp > 1 && zero >= stage; }
  // Elements of one rank's shard of an n-element parameter: an equal block
  // per rank, a multiple of shard_grain elements (whole blocks of
  // AdamW8bit's 256-element quantization, 256-byte aligned), so the ranks'
  // blocks, laid end to end, cover n with padding at the end.
  static constexpr std::int64_t shard_grain = 256;
  constexpr std::int64_t shard(std::int64_t n) const { return align_up(ceil_div(n, dp), shard_grain); }
  // Bytes of one rank's shard of a b-byte tensor stored as bytes (quantized codes, scales).
  constexpr std::int64_t shard_bytes(std::int64_t b) const { return align_up(ceil_div(b, dp), 256); }
  constexpr std::int64_t act_bytes() const { return size_of(dtype); }
  // Element bytes of statistics and scratch (f32, or f64 when the run is f64).
  constexpr std::int64_t compute_bytes() const { return dtype == DType::F64 ? 8 : 4; }
  constexpr bool cuda() const { return engine == Engine::cuda; }
  // OffloadOptimizer: the update runs over ranges of so many elements of a
  // parameter (a multiple of AdamW8bit's 256-element block); on the host
  // engine each range's gradient, optimizer state (and, with
  // OffloadParameters, values) is read from the offload tier's file into a
  // device-tier staging buffer and written back.
  static constexpr std::int64_t update_chunk = std::int64_t{1} << 14;
  // The staging buffer for ranges of `elements` (update_chunk, or fewer
  // when no parameter has so many): the gradient (and the values), then the
  // optimizer state.
  // One slot holds a range: its gradient (and with OffloadParameters its
  // values), then its optimizer state; the buffer has a slot per worker,
  // which updates its own ranges in it after the backward.
  constexpr std::int64_t update_staging_slot_bytes(std::int64_t elements) const {
    if (!offload_optimizer || cuda()) return 0;
    const std::int64_t values = (offload_params ? 2 : 1) * elements * act_bytes();
    return align_up(values, 256) + align_up(optim.state_bytes(elements), 256);
  }
  constexpr std::int64_t update_staging_bytes(std::int64_t elements) const {
    return workers * update_staging_slot_bytes(elements);
  }
};

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
  int collective = none;  // the collective it runs (Builder::collectives), for a collective event
};

// The names of the collectives the builder emits for a data-parallel run;
// the op types that run them (ops/collectives.hpp) carry the same names.
namespace collective {
inline constexpr std::string_view all_reduce_grads = "all_reduce_grads";
inline constexpr std::string_view reduce_scatter_grads = "reduce_scatter_grads";
inline constexpr std::string_view all_gather_params = "all_gather_params";
}  // namespace collective

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

// The builder a layer's `build` talks to.
class Builder {
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

  constexpr explicit Builder(RunConfig c) : cfg(c) {
    nodes.push_back(Node{"model", "Model", none, none, none, 1});
    events.push_back(Event{EventKind::load_batch, 0, none, none});
    bindings.push_back(Binding{});
  }

  // ---- context ---------------------------------------------------------
  constexpr std::int64_t tokens_count() const { return cfg.tokens(); }
  constexpr std::int64_t act(std::int64_t features) const { return cfg.tokens() * features * cfg.act_bytes(); }
  constexpr int current_group() const { return group_stack_.empty() ? none : group_stack_.back(); }
  constexpr int current_node() const { return node_stack_.empty() ? 0 : node_stack_.back(); }
  constexpr bool frozen() const { return frozen_ > 0; }
  // Inside a checkpointed segment (a layer within it recomputes anyway).
  constexpr bool in_checkpoint() const { return open_checkpoints_ > 0; }

  // ---- node scopes -------------------------------------------------------
  constexpr int open(std::string_view name, std::string_view kind, int index = none) {
    nodes.push_back(Node{name, kind, current_node(), index, current_group(), 1});
    node_stack_.push_back(static_cast<int>(nodes.size()) - 1);
    return node_stack_.back();
  }
  constexpr void close() { node_stack_.pop_back(); }

  // Build layer L under a child node named `name`.
  template <class L>
  constexpr Ref child(std::string_view name, Ref x, int index = none) {
    open(name, L::kind, index);
    Ref y = L::build(*this, x);
    close();
    return y;
  }
  // Only the parameters of layer L, under a child node named `name`, with no
  // op: the last pipeline stage's copy of the embedding table an LM head is
  // tied to (Embedding::declare; layers/pipeline_stages.hpp).
  template <class L>
  constexpr void declare(std::string_view name, int index = none) {
    open(name, L::kind, index);
    L::declare(*this);
    close();
  }

  // ---- policies that are scopes ----------------------------------------------
  constexpr void push_frozen() { ++frozen_; }
  constexpr void pop_frozen() { --frozen_; }
  constexpr void push_quant(QuantDesc q) { quant_stack_.push_back(q); }
  constexpr void pop_quant() { quant_stack_.pop_back(); }

  // ---- tensor parallelism (layers/tensor_parallel.hpp) ------------------------------
  // Parameters made inside a split scope are this rank's block of the
  // whole (graph/tensor_split.hpp): rows (a column-parallel projection: its
  // matrix and bias; a vocabulary-parallel table) or columns (a
  // row-parallel projection's matrix; a 1-column parameter stays whole).
  // The layer passes the block's dims; the scope records how it was cut.
  constexpr void push_split(SplitAxis axis, int parts = 1) { split_stack_.push_back(TensorSplit{axis, parts, cfg.tp}); }
  constexpr void pop_split() { split_stack_.pop_back(); }
  constexpr TensorSplit split() const { return split_stack_.empty() ? TensorSplit{} : split_stack_.back(); }

  // ---- tensors -----------------------------------------------------------------
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

  // An activation produced by the op about to be emitted: [tokens, features].
  constexpr Ref activation(std::string_view name, std::int64_t features) {
    return Ref{new_tensor(name, Role::activation, act(features), current_group()), none};
  }
  // Any other tensor produced by the next op (statistics such as rstd, lse).
  constexpr Ref produced(std::string_view name, std::int64_t bytes) {
    return Ref{new_tensor(name, Role::activation, bytes, current_group()), none};
  }

  // ---- parameters -------------------------------------------------------------------
  // A dense parameter, trainable unless inside Frozen / Quantized / a LoRA base.
  // `init`: how its values start (core/param_init.hpp); by default by its name.
  constexpr int param(std::string_view name, std::int64_t rows, std::int64_t cols, ParamInit init = {}) {
    const int p = make_param(name, rows, cols, !frozen(), QuantDesc{});
    params[p].init = init;
    return p;
  }
  // The main matrix of a projection: quantized when inside Quantized<Q, L>.
  constexpr int matrix(std::string_view name, std::int64_t rows, std::int64_t cols) {
    if (!quant_stack_.empty()) return make_param(name, rows, cols, false, quant_stack_.back());
    return param(name, rows, cols);
  }
  // An adapter parameter: trainable even inside a frozen scope (LoRA's A, B).
  constexpr int adapter(std::string_view name, std::int64_t rows, std::int64_t cols) {
    return make_param(name, rows, cols, true, QuantDesc{});
  }

  // ---- ops ------------------------------------------------------------------------------
  constexpr int emit(Op op, EventKind kind = EventKind::forward) {
    op.node = current_node();
    op.group = current_group();
    const int gather = gather_params(op);
    const int e = push_event(kind, op.node, op.group);
    read_gathered(gather, e);
    op.event = e;
    ops.push_back(op);
    const int id = static_cast<int>(ops.size()) - 1;
    events[e].op = id;
    for (int i = 0; i < op.n_in; ++i) use(bindings[e].in[i] = op.in[i], e);
    if (op.inout.valid()) use(bindings[e].inout = op.inout, e);
    for (int i = 0; i < op.n_out; ++i) born(bindings[e].out[i] = op.out[i], e);
    if (op.scratch_fwd > 0) scratch("scratch", op.scratch_fwd, e);
    return id;
  }

  // A GEMM of an (m, k) by (k, n) product the op about to be emitted runs:
  // on the host the workspace grows to the largest panels any GEMM needs; on
  // CUDA it is the one cuBLASLt workspace every GEMM shares.
  constexpr void gemm(std::int64_t m, std::int64_t n, std::int64_t k) {
    const std::int64_t bytes = cfg.cuda() ? CudaWorkspace::gemm_bytes
                                          : cfg.workers * GemmBlocking::panel_elements(m, n, k, is_half(cfg.dtype)) *
                                                cfg.compute_bytes();
    if (gemm_workspace == none) {
      gemm_workspace = persistent(cfg.cuda() ? "cublaslt workspace" : "gemm panels", Role::scratch, 0, none);
      tensors[gemm_workspace].node = 0;
    }
    if (bytes > tensors[gemm_workspace].bytes) tensors[gemm_workspace].bytes = bytes;
  }

  // ---- segments (Checkpointed, Offloaded) -----------------------------------------------
  constexpr int begin_segment(Ref input, bool checkpoint, bool offload) {
    Segment s{};
    s.first_op = static_cast<int>(ops.size());
    s.node = current_node();
    s.group = current_group();
    s.checkpoint = checkpoint;
    s.offload = offload;
    s.input = input;
    segments.push_back(s);
    if (checkpoint) ++open_checkpoints_;
    return static_cast<int>(segments.size()) - 1;
  }
  constexpr void end_segment(int s) {
    if (segments[s].checkpoint) --open_checkpoints_;
    segments[s].end_op = static_cast<int>(ops.size());
    if (segments[s].offload) {
      const int e = push_event(EventKind::offload, segments[s].node, segments[s].group);
      segments[s].offload_event = e;
      bindings[e].segment = s;
    }
  }

  // ---- groups (Repeat) ------------------------------------------------------------------
  // Opens a group of `count` instances; returns the block input to build with.
  constexpr Ref begin_group(int count, Ref input) {
    Group g{};
    g.count = count;
    g.node = current_node();
    g.first_op = static_cast<int>(ops.size());
    g.input = input;
    groups.push_back(g);
    const int gid = static_cast<int>(groups.size()) - 1;
    nodes[g.node].repeat = count;
    nodes[g.node].group = current_group();
    group_stack_.push_back(gid);
    const int p = new_tensor(tensors[input.id].name, Role::activation, tensors[input.id].bytes, gid);
    tensors[p].is_virtual = true;
    tensors[p].outer = input;
    groups[gid].placeholder = p;
    return Ref{p, none};
  }
  // Closes the group whose block returned `output`; returns the group's output.
  constexpr Ref end_group(Ref output) {
    const int gid = group_stack_.back();
    group_stack_.pop_back();
    groups[gid].end_op = static_cast<int>(ops.size());
    groups[gid].output = output.id;
    tensors[groups[gid].placeholder].prev = output.id;
    return Ref{output.id, groups[gid].count - 1};
  }

  // ---- loss and batch ----------------------------------------------------------------------
  constexpr void open_batch() {
    tokens = Ref{new_tensor("tokens", Role::batch_io, cfg.tokens() * 4, none), none};
    targets = Ref{new_tensor("targets", Role::batch_io, cfg.tokens() * 4, none), none};
    born(tokens, 0);
    born(targets, 0);
  }

  // ---- the timeline after forward --------------------------------------------------------------
  // Generates backward (reverse op order), recompute, prefetch and update
  // events, and every endpoint they imply. Call once, after the model's build.
  constexpr void finish() {
    if (cfg.offload_optimizer && !cfg.cuda()) {
      std::int64_t largest = 0;  // the most elements a process updates of one parameter
      for (const Param& p : params)
        if (p.trainable) largest = std::max(largest, cfg.sharded(1) ? cfg.shard(p.elements()) : p.elements());
      const std::int64_t range = std::min(largest, RunConfig::update_chunk);
      if (range > 0) {
        update_staging = persistent("update staging", Role::scratch, cfg.update_staging_bytes(range), none);
        tensors[update_staging].node = 0;
      }
    }
    if (cfg.cuda()) {
      reductions = persistent("reductions", Role::scratch, CudaWorkspace::reduction_bytes, none);
      tensors[reductions].node = 0;
      staging = persistent("host staging", Role::batch_io, CudaWorkspace::staging_bytes(cfg.tokens() * cfg.accumulate), none);
      tensors[staging].tier = Tier::offload;
      tensors[staging].node = 0;
    }
    grad_of_.assign(tensors.size() * 2 + 64, none);
    remap_.assign(tensors.size() * 2 + 64, none);
    first_user_.assign(params.size(), none);
    for (int i = 0; i < static_cast<int>(ops.size()); ++i)
      for (int p : ops[i].param)
        if (p != none && first_user_[p] == none) first_user_[p] = i;
    prefetch_pre_.assign(segments.size(), none);
    prefetch_in_.assign(segments.size(), none);
    const int n = static_cast<int>(ops.size());
    for (int i = n - 1; i >= 0; --i) {
      enter_segments_backward(i);
      run_backward(i);
      leave_groups_backward(i);
    }
    const int upd = push_event(EventKind::update, 0, none);
    for (auto& p : params) {
      if (p.grad == none) continue;
      // what the update reads: the gradient, or this rank's shard of it, or
      // its copy in the offload tier
      const int g = p.host_grad != none ? p.host_grad : p.grad_shard != none ? p.grad_shard : p.grad;
      if (offloaded_after_sum(cfg, p)) {  // summed on the device, then copied to the offload tier at the update
        const int d = p.grad_shard != none ? p.grad_shard : p.grad;
        if (cfg.accumulate > 1) {
          tensors[d].persistent = tensors[g].persistent = true;
        } else {
          use(Ref{d, none}, upd);
          born(Ref{g, none}, upd);
        }
      } else if (cfg.accumulate > 1) {
        tensors[g].persistent = true;
      } else if (!cfg.update_in_backward) {
        use(Ref{g, none}, upd);
      }
    }
    if (loss.valid()) use(loss, upd);
    forward_virtuals();
  }

  constexpr int grad_of(int t) const { return t < static_cast<int>(grad_of_.size()) ? grad_of_[t] : none; }

 private:
  detail::cvec<int> node_stack_;
  detail::cvec<int> group_stack_;
  detail::cvec<QuantDesc> quant_stack_;
  detail::cvec<TensorSplit> split_stack_;
  int frozen_ = 0;
  int open_checkpoints_ = 0;
  detail::cvec<int> grad_of_;
  detail::cvec<int> remap_;        // checkpoint / offload: tensor -> copy used by backward
  detail::cvec<int> active_seg_;   // segments whose backward is in progress
  detail::cvec<int> first_user_;   // per parameter: the first op (forward order) that reads it

  constexpr int push_event(EventKind k, int node, int group) {
    events.push_back(Event{k, node, group, none});
    bindings.push_back(Binding{});
    return static_cast<int>(events.size()) - 1;
  }

  constexpr int make_param(std::string_view name, std::int64_t rows, std::int64_t cols, bool trainable, QuantDesc q) {
    Param p{};
    p.name = name;
    p.node = current_node();
    p.rows = rows;
    p.cols = cols;
    p.trainable = trainable;
    p.quant = q;
    p.group = current_group();
    p.split = split();
    if (p.split.axis == SplitAxis::cols && cols == 1) p.split = TensorSplit{};
    const std::int64_t n = rows * cols;
    // Data parallelism with ZeRO: each rank keeps its shard (cfg.shard(n)
    // elements) of what its stage shards; the full tensors a collective
    // fills are padded to dp shards.
    const std::int64_t shard = cfg.shard(n), padded = shard * cfg.dp;
    const Tier stored_in = cfg.offload_params ? Tier::offload : Tier::device;
    if (q.kind != QuantKind::none) {
      const std::int64_t codes = q.code_bytes(n), scales = q.scale_bytes(n);
      p.weight = persistent(name, Role::weights, cfg.sharded(3) ? cfg.shard_bytes(codes) : codes, p.group, stored_in);
      p.scales = persistent("absmax", Role::quant_scales, cfg.sharded(3) ? cfg.shard_bytes(scales) : scales, p.group, stored_in);
      if (q.table_bytes() > 0 && quant_table == none)
        quant_table = persistent("code tables", Role::quant_scales, q.table_bytes(), none);
      // the table grows to the largest format's (NF4 and NF4DQ in one model: with the dynamic map)
      if (quant_table != none && q.table_bytes() > tensors[quant_table].bytes) tensors[quant_table].bytes = q.table_bytes();
      if (quant_table != none) tensors[quant_table].node = 0;  // shared by the model
    } else {
      // ZeRO 3: the shard; ZeRO 1 and 2: the whole, padded for the all-gather after the update
      const std::int64_t stored = cfg.sharded(3) ? shard : trainable && cfg.sharded(1) ? padded : n;
      p.weight = persistent(name, Role::weights, stored * cfg.act_bytes(), p.group, stored_in);
    }
    if (trainable) {
      const std::int64_t owned = cfg.sharded(1) ? shard : n;  // the elements this rank updates
      // OffloadOptimizer: what the update reads and writes lives in the
      // offload tier; an f32 master copy also where the device's weights
      // are out of the host's reach (the CUDA engine)
      const Tier states = cfg.offload_optimizer ? Tier::offload : Tier::device;
      if (is_half(cfg.dtype) || (cfg.offload_optimizer && cfg.cuda()))
        p.master = persistent("master", Role::master_weights, owned * 4, p.group, states);
      if (cfg.sharded(2)) {
        // backward fills the whole gradient (the bucket); the reduce-scatter leaves this rank its shard
        p.grad = new_tensor("grad bucket", Role::communication, padded * cfg.act_bytes(), p.group);
        p.grad_shard = new_tensor("grad", Role::grads, shard * cfg.act_bytes(), p.group);
      } else {
        p.grad = new_tensor("grad", Role::grads, n * cfg.act_bytes(), p.group);
      }
      // what the update reads (ZeRO 2 and 3: this rank's shard), in the offload tier
      if (cfg.offload_optimizer)
        p.host_grad = new_tensor("offloaded grad", Role::grads, (cfg.sharded(2) ? shard : n) * cfg.act_bytes(), p.group, Tier::offload);
      if (cfg.optim.states > 0)
        p.state = persistent("state", Role::optimizer_state, cfg.optim.state_bytes(owned), p.group, states);
      if (cfg.optim.table_bytes() > 0 && optim_table == none)
        optim_table = persistent("dynamic maps", Role::optimizer_state, cfg.optim.table_bytes(), none, states);
      if (optim_table != none) tensors[optim_table].node = 0;  // shared by the model
    }
    params.push_back(p);
    return static_cast<int>(params.size()) - 1;
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

  // The tensor backward reads in place of r (recomputed or prefetched copy).
  constexpr Ref resolve(Ref r, int seg) {
    if (r.fixed == none && remap_[r.id] != none) return Ref{remap_[r.id], none};
    if (seg != none && segments[seg].offload && r.fixed == none && is_fwd_activation(r.id))
      return Ref{prefetched_copy(r.id, seg), none};
    return r;
  }
  constexpr bool is_fwd_activation(int t) const {
    const Role ro = tensors[t].role;
    return (ro == Role::activation || ro == Role::saved_activation) && !tensors[t].persistent;
  }

  // ---- backward generation -----------------------------------------------------------------
  // The outermost checkpoint segment whose last op is `op`: segments that end
  // together (Checkpointed<Checkpointed<L>>) recompute once.
  constexpr int outermost_checkpoint_ending_at(int op) const {
    int best = none;
    for (int s = 0; s < static_cast<int>(segments.size()); ++s) {
      const auto& sg = segments[s];
      if (sg.end_op - 1 != op || sg.first_op >= sg.end_op || !sg.checkpoint) continue;
      if (best == none || sg.first_op < segments[best].first_op) best = s;
    }
    return best;
  }
  constexpr int innermost_active_offload(int op) const {
    int best = none;
    for (int s : active_seg_) {
      const auto& sg = segments[s];
      if (!sg.offload || op < sg.first_op || op >= sg.end_op) continue;
      if (best == none || sg.first_op > segments[best].first_op) best = s;
    }
    return best;
  }

  constexpr void enter_segments_backward(int i) {
    // offload: the prefetch is issued ahead of the segment's backward (see issue_prefetch)
    for (int s = 0; s < static_cast<int>(segments.size()); ++s) {
      const auto& sg = segments[s];
      if (sg.end_op - 1 == i && sg.offload && sg.first_op < sg.end_op) {
        issue_prefetch(s);
        active_seg_.push_back(s);
      }
    }
    const int c = outermost_checkpoint_ending_at(i);
    if (c != none) recompute(c);
  }

  // Prefetch events of offload segment s. A segment that is a whole repeated
  // block is fetched at the start of the next instance's backward (and the
  // last instance just before the group's backward starts); other segments
  // just before their own backward begins.
  constexpr void issue_prefetch(int s) {
    auto& sg = segments[s];
    bool whole_block = false;
    for (const auto& g : groups)
      if (sg.group != none && g.first_op == sg.first_op && g.end_op == sg.end_op) whole_block = true;
    if (whole_block) {
      const int pre = push_event(EventKind::prefetch, sg.node, none);
      const int in = push_event(EventKind::prefetch, sg.node, sg.group);
      prefetch_pre_[s] = pre;
      prefetch_in_[s] = in;
      bindings[pre].segment = bindings[in].segment = s;
    } else {
      const int e = push_event(EventKind::prefetch, sg.node, sg.group);
      bindings[e].segment = s;
      prefetch_pre_[s] = none;
      prefetch_in_[s] = e;
    }
  }
  detail::cvec<int> prefetch_pre_;  // per segment: the ungrouped prefetch before a group's backward
  detail::cvec<int> prefetch_in_;   // per segment: the prefetch event inside the timeline

  constexpr bool whole_block_segment(int s) const { return prefetch_pre_[s] != none; }

  constexpr int prefetched_copy(int t, int s) {
    // one copy per (tensor, segment); remap_ holds it while the segment's backward runs
    if (remap_[t] != none) return remap_[t];
    const Segment sg = segments[s];
    const int g = tensors[t].group;
    const int host = new_tensor(tensors[t].name, tensors[t].role, tensors[t].bytes, g, Tier::offload);
    const int dev = new_tensor(tensors[t].name, Role::saved_activation, tensors[t].bytes, g);
    tensors[host].node = tensors[dev].node = sg.node;
    tensors[host].role = tensors[dev].role = Role::saved_activation;
    // the original lives until its offload copy is made
    add_endpoint(t, sg.offload_event, 0, none, none, false);
    add_endpoint(host, sg.offload_event, 0, none, none, true);
    if (whole_block_segment(s)) {
      add_endpoint(host, prefetch_in_[s], 1, none, not_last, false);
      add_endpoint(host, prefetch_pre_[s], 0, 0, groups[g].count - 1, false);
      add_endpoint(dev, prefetch_in_[s], 1, none, not_last, true);
      add_endpoint(dev, prefetch_pre_[s], 0, 0, groups[g].count - 1, true);
    } else {
      add_endpoint(host, prefetch_in_[s], 0, none, none, false);
      add_endpoint(dev, prefetch_in_[s], 0, none, none, true);
    }
    grow(dev);
    remap_[t] = dev;
    copies.push_back(Copy{s, t, host, dev});
    return dev;
  }
  constexpr void grow(int t) {
    while (static_cast<int>(remap_.size()) <= t + 1) remap_.push_back(none);
    while (static_cast<int>(grad_of_.size()) <= t + 1) grad_of_.push_back(none);
  }

  // Re-runs the forward of checkpoint segment s, op by op, producing
  // recompute tensors that backward reads instead of the originals.
  constexpr void recompute(int s) {
    const auto sg = segments[s];
    // which ops' outputs backward needs: saved by some op of the segment, or
    // read by a later recomputed op. An op that only adds into a tensor in
    // place (LoRA into its base output) does not make that tensor needed: when
    // nothing reads the sum again, recompute runs the adapter alone (for A x).
    detail::cvec<char> needed(ops.size(), 0);
    for (int k = sg.end_op - 1; k >= sg.first_op; --k) {
      bool need = false;
      for (int j = k; j < sg.end_op && !need; ++j) {
        const auto& oj = ops[j];
        for (int q = 0; q < oj.n_saved; ++q)
          for (int o = 0; o < ops[k].n_out; ++o)
            if (oj.saved[q] == ops[k].out[o]) need = true;
        if (j > k && needed[j])
          for (int q = 0; q < oj.n_in; ++q)
            for (int o = 0; o < ops[k].n_out; ++o)
              if (oj.in[q] == ops[k].out[o]) need = true;
      }
      needed[k] = need;
    }
    // an op that only updates a tensor in place (a tensor-parallel sum)
    // reruns when the op producing that tensor does
    for (int k = sg.first_op; k < sg.end_op; ++k) {
      if (ops[k].n_out > 0 || !ops[k].inout.valid()) continue;
      for (int j = sg.first_op; j < k; ++j)
        for (int o = 0; o < ops[j].n_out; ++o)
          if (needed[j] && ops[j].out[o] == ops[k].inout) needed[k] = 1;
    }
    const int seg_off = innermost_active_offload(sg.first_op);
    for (int k = sg.first_op; k < sg.end_op; ++k) {
      if (!needed[k]) continue;
      const Op op = ops[k];
      const int gather = gather_params(op);
      const int e = push_event(EventKind::recompute, op.node, op.group);
      read_gathered(gather, e);
      events[e].op = k;
      for (int q = 0; q < op.n_in; ++q) use(bindings[e].in[q] = resolve(op.in[q], seg_off), e);
      if (op.inout.valid() && op.inout.fixed == none && remap_[op.inout.id] != none)
        use(bindings[e].inout = resolve(op.inout, seg_off), e);
      for (int o = 0; o < op.n_out; ++o) {
        const Ref orig = op.out[o];
        const int r = new_tensor(tensors[orig.id].name, Role::recompute, tensors[orig.id].bytes, tensors[orig.id].group);
        tensors[r].node = tensors[orig.id].node;
        grow(r);
        add_endpoint(r, e, 0, none, none, true);
        bindings[e].out[o] = Ref{r, none};
        remap_[orig.id] = r;
      }
      if (op.scratch_fwd > 0) scratch("scratch", op.scratch_fwd, e);
    }
  }

  constexpr int ensure_grad(Ref r) {
    if (grad_of_[r.id] == none) {
      const Tensor t = tensors[r.id];
      const int g = new_tensor(t.name, Role::activation_grad, t.bytes, t.group);
      tensors[g].node = t.node;
      grow(g);
      grad_of_[r.id] = g;
    }
    return grad_of_[r.id];
  }

  constexpr void run_backward(int i) {
    const Op op = ops[i];
    int e = op.event;  // a fused loss writes its gradients during its forward event
    if (!op.fused_loss) {
      const int gather = gather_params(op);
      e = push_event(EventKind::backward, op.node, op.group);
      read_gathered(gather, e);
      events[e].op = i;
    }
    const int seg = innermost_active_offload(i);
    // saved tensors: read again now (recomputed / prefetched where applicable)
    Binding& bd = bindings[e];
    for (int q = 0; q < op.n_saved; ++q) {
      use(bd.saved[q] = resolve(op.saved[q], seg), e);
    }
    // gradients of outputs: read (the producer is their last reader)
    for (int o = 0; o < op.n_out; ++o) {
      const int g = grad_of_[op.out[o].id];
      if (g != none) use(bd.d_out[o] = Ref{g, op.out[o].fixed}, e);
    }
    if (op.inout.valid()) {
      const int g = grad_of_[op.inout.id];
      if (g != none) use(bd.d_inout = Ref{g, op.inout.fixed}, e);
    }
    // gradients of inputs: accumulate (aliasing the output's for residual adds)
    for (int q = 0; q < op.n_in; ++q) {
      if (!op.in_grad[q]) continue;
      const Ref x = op.in[q];
      if (op.in_alias[q] && grad_of_[x.id] == none && op.n_out > 0 && grad_of_[op.out[0].id] != none &&
          x.fixed == none && !reads_sibling_producer(i, q)) {
        grad_of_[x.id] = grad_of_[op.out[0].id];
        continue;
      }
      const int g = ensure_grad(x);
      bindings[e].d_in[q] = Ref{g, x.fixed};
      born(Ref{g, x.fixed}, e);
      use(Ref{g, x.fixed}, e);
    }
    // parameter gradients
    for (int q = 0; q < op.n_grads; ++q) {
      born(Ref{op.grads[q], none}, e);
      use(Ref{op.grads[q], none}, e);
    }
    if (op.scratch_bwd > 0) scratch("scratch", op.scratch_bwd, e);
    const int reduced = reduce_grads(i);
    stream_grads(i, reduced != none ? reduced : e);
    // leaving segments that start at this op
    for (int k = static_cast<int>(active_seg_.size()) - 1; k >= 0; --k) {
      if (segments[active_seg_[k]].first_op == i) {
        for (auto& m : remap_) m = none;
        active_seg_.erase_at(k);
      }
    }
    for (const auto& sg : segments)
      if (sg.checkpoint && sg.first_op == i)
        for (auto& m : remap_) m = none;
  }

  // ---- data parallelism -------------------------------------------------------------------------
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

  // Input q of op i may share the output's gradient (a residual add) only if
  // the op producing another aliased input does not read it too: that op's
  // backward would read dy and write dx into one buffer (Residual<Linear>).
  constexpr bool reads_sibling_producer(int i, int q) const {
    const Op& op = ops[i];
    const Ref x = op.in[q];
    for (int r = 0; r < op.n_in; ++r) {
      if (r == q || !op.in_alias[r]) continue;
      for (int k = i - 1; k >= 0; --k) {
        const Op& p = ops[k];
        bool produces = p.inout == op.in[r];
        for (int o = 0; o < p.n_out; ++o) produces = produces || p.out[o] == op.in[r];
        if (!produces) continue;
        for (int a = 0; a < p.n_in; ++a)
          if (p.in[a] == x) return true;
        if (p.inout.valid() && p.inout != op.in[r] && p.inout == x) return true;
      }
    }
    return false;
  }

  // After the first op of a group has run its backward: link the gradient
  // of the block input across instances.
  constexpr void leave_groups_backward(int i) {
    for (auto& g : groups) {
      if (g.first_op != i) continue;
      const int p = g.placeholder;
      const int gp = grad_of_[p];
      if (gp == none) continue;
      const int gy = grad_of_[g.output];
      const Ref x = g.input;
      if (gp == gy && gy != none) {
        // a residual stream: one gradient buffer shared by every instance
        // and by the tensor feeding the group
        tensors[gy].collapsed = true;
        if (grad_of_[x.id] == none) {
          grad_of_[x.id] = gy;
        } else {
          tensors[grad_of_[x.id]].alias = gy;
        }
      } else {
        const int gx = ensure_grad(x);
        tensors[gp].is_virtual = true;
        tensors[gp].outer = Ref{gx, x.fixed};
        tensors[gp].prev = gy;
      }
    }
  }

  // Forward endpoints recorded on virtual tensors (a group's block input and
  // its gradient) to the tensors they stand for.
  constexpr void forward_virtuals() {
    const int n = static_cast<int>(endpoints.size());
    for (int k = 0; k < n; ++k) {
      const Endpoint ep = endpoints[k];
      const Tensor& t = tensors[ep.tensor];
      if (!t.is_virtual) continue;
      const int count = groups[t.group].count;
      // instance 0 is the outer tensor
      {
        Endpoint o = ep;
        o.tensor = t.outer.id;
        if (ep.abs == none) o.abs = ep.rel;  // event instance 0 + rel
        o.rel = 0;
        o.only = t.outer.fixed;
        if (o.abs >= 0 && o.abs < count) endpoints.push_back(o);
        else if (o.abs == all_instances) endpoints.push_back(o);
      }
      // instance j > 0 is instance j-1 of prev
      if (t.prev != none) {
        Endpoint o = ep;
        o.tensor = t.prev;
        o.rel = ep.rel + 1;
        o.only = not_last;
        endpoints.push_back(o);
      }
    }
    // collapsed aliases: fold endpoints of aliased tensors into their target
    for (int k = 0; k < static_cast<int>(endpoints.size()); ++k) {
      int a = tensors[endpoints[k].tensor].alias;
      if (a != none) endpoints[k].tensor = a;
    }
  }
};

}  // namespace graph
}  // namespace headroom
