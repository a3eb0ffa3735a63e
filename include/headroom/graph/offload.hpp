#pragma once
// graph::Offload: the copies of an Offloaded segment's activations, out
// after its forward and back before its backward.
#include "builder.hpp"

namespace headroom::graph {

// Offloaded segments in the backward: each activation the segment keeps is
// copied to the offload tier by its offload event and back by a prefetch
// event issued ahead of the segment's backward, which reads the copy.
class Offload : public Builder {
 public:
  using Builder::Builder;

 protected:
  detail::cvec<int> active_seg_;   // segments whose backward is in progress
  detail::cvec<int> prefetch_pre_;  // per segment: the ungrouped prefetch before a group's backward
  detail::cvec<int> prefetch_in_;   // per segment: the prefetch event inside the timeline

  constexpr int innermost_active_offload(int op) const {
    int best = none;
    for (int s : active_seg_) {
      const auto& sg = segments[s];
      if (!sg.offload || op < sg.first_op || op >= sg.end_op) continue;
      if (best == none || sg.first_op > segments[best].first_op) best = s;
    }
    return best;
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
};

}  // namespace headroom::graph
