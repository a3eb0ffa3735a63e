#pragma once
// graph::Builder: what a layer's `build` calls, in constexpr code, to
// declare its parameters, open child scopes and emit its ops (graph/graph.hpp
// describes what it records).
#include <cstdint>
#include <string_view>

#include "sharding.hpp"

namespace headroom::graph {

// The builder a layer's `build` talks to: scopes, parameters, tensors and
// ops, in forward order.
class Builder : public Sharding {
 public:
  using Sharding::Sharding;

  constexpr bool frozen() const { return frozen_ > 0; }
  // Inside a checkpointed segment (a layer within it recomputes anyway).
  constexpr bool in_checkpoint() const { return open_checkpoints_ > 0; }

  // ---- node scopes -----------------------------------------------------------
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

  // ---- tensor parallelism (layers/tensor_parallel.hpp) -----------------------
  // Parameters made inside a split scope are this rank's block of the
  // whole (graph/tensor_split.hpp): rows (a column-parallel projection: its
  // matrix and bias; a vocabulary-parallel table) or columns (a
  // row-parallel projection's matrix; a 1-column parameter stays whole).
  // The layer passes the block's dims; the scope records how it was cut.
  constexpr void push_split(SplitAxis axis, int parts = 1) { split_stack_.push_back(TensorSplit{axis, parts, cfg.tp}); }
  constexpr void pop_split() { split_stack_.pop_back(); }
  constexpr TensorSplit split() const { return split_stack_.empty() ? TensorSplit{} : split_stack_.back(); }

  // ---- tensors ---------------------------------------------------------------
  // An activation produced by the op about to be emitted: [tokens, features].
  constexpr Ref activation(std::string_view name, std::int64_t features) {
    return Ref{new_tensor(name, Role::activation, act(features), current_group()), none};
  }

  // Any other tensor produced by the next op (statistics such as rstd, lse).
  constexpr Ref produced(std::string_view name, std::int64_t bytes) {
    return Ref{new_tensor(name, Role::activation, bytes, current_group()), none};
  }

  // ---- parameters ------------------------------------------------------------
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

  // ---- ops -------------------------------------------------------------------
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

  // ---- segments (Checkpointed, Offloaded) ------------------------------------
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

  // ---- groups (Repeat) -------------------------------------------------------
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

  // ---- loss and batch --------------------------------------------------------
  constexpr void open_batch() {
    tokens = Ref{new_tensor("tokens", Role::batch_io, cfg.tokens() * 4, none), none};
    targets = Ref{new_tensor("targets", Role::batch_io, cfg.tokens() * 4, none), none};
    born(tokens, 0);
    born(targets, 0);
  }

 protected:
  detail::cvec<QuantDesc> quant_stack_;
  detail::cvec<TensorSplit> split_stack_;
  int frozen_ = 0;
  int open_checkpoints_ = 0;

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
};

}  // namespace headroom::graph
