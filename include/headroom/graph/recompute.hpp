#pragma once
// graph::Recompute: a Checkpointed segment's forward, run again for its
// backward.
#include "offload.hpp"

namespace headroom::graph {

// Checkpointed segments in the backward: the segment's forward runs again
// before its backward, op by op, for what that backward reads.
class Recompute : public Offload {
 public:
  using Offload::Offload;

 protected:
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
};

}  // namespace headroom::graph
