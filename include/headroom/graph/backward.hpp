#pragma once
// graph::StepBuilder: the whole step from a recorded forward: backward,
// recompute, prefetch, gradient collectives and the update (finish()).
#include <algorithm>
#include <cstdint>

#include "recompute.hpp"

namespace headroom::graph {

// The builder of a whole step: a model records its forward through
// Builder's interface, then finish() adds the backward (reverse op order),
// the recompute and prefetch events, the gradient collectives and the
// update, and every endpoint they imply.
class StepBuilder : public Recompute {
 public:
  using Recompute::Recompute;

  // Generates backward (reverse op order), recompute, prefetch and update
  // events, and every endpoint they imply. Call once, after the model's build.
  constexpr void finish() {
    if (cfg.offload_optimizer && !cfg.cuda()) {
      std::int64_t largest = 0;  // the most elements a process updates of one parameter
      for (const Param& p : params)
        if (p.trainable) largest = std::max(largest, cfg.sharded(1) ? cfg.shard(p.elements()) : p.elements());
      const std::int64_t range = std::min(largest, RunConfig::update_chunk);
      if (range > 0) {
        update_range = range;
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

 private:
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

}  // namespace headroom::graph
