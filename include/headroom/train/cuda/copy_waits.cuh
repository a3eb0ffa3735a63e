#pragma once
// Where the CUDA engine's compute stream waits for work on its other
// streams. Tier copies (offload, prefetch, OffloadParameters' fetches) run
// on the copy stream and the ops of the communication lane on the
// communication stream, each recording an event when done; the compute
// stream waits for that event only before the first later step that reads
// or writes a byte the work touches (an offload's source may be reused; a
// prefetch's destination is read by a backward, a fetch's by the event it
// fetches for), or at the end of the micro-batch when no step does. Copies
// keep their order on the copy stream, so they need no waits among
// themselves. Computed once per trainer from the schedule.
#include <cstdint>
#include <span>
#include <vector>

#include "../../plan/schedule.hpp"
#include "../op_table.hpp"

namespace headroom::cuda {

// Whether step st reads or writes any of the device bytes [from, from +
// bytes): any of its slots (the first copy of each), its parameters as
// gathered or fetched for it, the gradients it writes. A fetch touches none
// (its copies keep their order on the copy stream; its `in` is the offload tier).
constexpr bool touches(const Step& st, std::int64_t from, std::int64_t bytes) {
  if (st.kind == EventKind::fetch) return false;
  bool hit = false;
  trainers::detail::for_each_slot(st, [&](const Slot& s) { hit = hit || (s.bound() && s.offset < from + bytes && from < s.offset + s.bytes); });
  return hit;
}

// Per schedule step g up to the micro-batch's end: the steps whose work on
// another stream the compute stream waits for before g (before(end): at the
// end of the micro-batch).
class CopyWaits {
 public:
  // lane_join: per step of an op on the communication lane, the step before
  // which it is joined (trainers::join_steps); offloaded: with
  // OffloadOptimizer the copy of each gradient to the offload tier after the
  // step that completes it (gradient elements of grad_bytes each).
  template <class Sched, class LaneJoin>
  static CopyWaits plan(const Sched& sched, const LaneJoin& lane_join, int end, bool offloaded, std::int64_t grad_bytes) {
    std::vector<std::vector<int>> at(static_cast<std::size_t>(end) + 1);
    auto first_touching = [&](int g, auto&& touched_at) {
      int h = g + 1;
      while (h < end && !touched_at(h)) ++h;
      at[static_cast<std::size_t>(h)].push_back(g);
    };
    for (int g = 0; g < end; ++g) {
      const Step& st = sched.steps[static_cast<std::size_t>(g)];
      if (lane_join[static_cast<std::size_t>(g)] >= 0) {  // an op on the communication lane: joined where trainers::join_steps says
        at[static_cast<std::size_t>(lane_join[static_cast<std::size_t>(g)])].push_back(g);
        continue;
      }
      if (offloaded && st.update_end > st.update_begin)  // the gradients it completes go to the offload tier
        first_touching(g, [&](int h) {
          for (int u = st.update_begin; u < st.update_end; ++u) {
            const auto& p = sched.params[static_cast<std::size_t>(sched.updates[static_cast<std::size_t>(u)])];
            if (touches(sched.steps[static_cast<std::size_t>(h)], p.grad, p.elements() * grad_bytes)) return true;
          }
          return false;
        });
      if (st.kind != EventKind::offload && st.kind != EventKind::prefetch && st.kind != EventKind::fetch) continue;
      first_touching(g, [&](int h) {
        for (int c = st.copy_begin; c < st.copy_end; ++c) {
          const CopyStep& cp = sched.copies[static_cast<std::size_t>(c)];
          if (touches(sched.steps[static_cast<std::size_t>(h)], st.kind == EventKind::offload ? cp.from : cp.to, cp.bytes)) return true;
        }
        return false;
      });
    }
    CopyWaits w;
    w.first_.assign(static_cast<std::size_t>(end) + 2, 0);
    for (int g = 0; g <= end; ++g) {
      w.first_[static_cast<std::size_t>(g)] = static_cast<int>(w.steps_.size());
      for (const int c : at[static_cast<std::size_t>(g)]) w.steps_.push_back(c);
    }
    w.first_[static_cast<std::size_t>(end) + 1] = static_cast<int>(w.steps_.size());
    return w;
  }

  std::span<const int> before(int g) const {
    return std::span<const int>(steps_).subspan(static_cast<std::size_t>(first_[static_cast<std::size_t>(g)]),
                                                static_cast<std::size_t>(first_[static_cast<std::size_t>(g) + 1] - first_[static_cast<std::size_t>(g)]));
  }

 private:
  std::vector<int> steps_;  // the waits, step by step
  std::vector<int> first_;  // step g's: [first_[g], first_[g + 1]) of steps_
};

// OffloadParameters: the step before which fetch g is issued on the copy
// stream. The plan has the fetched copies alive from the compute event
// before the fetch where that event is of the op's group (graph/sharding.hpp,
// fetch_params), so the copy may run beside that event (the op before):
// issued before it, the copy waits only for the compute stream's work up to
// the step before it, whose buffers died there. Checked here: the copies
// share no byte with what that event reads or writes, nor with the copies
// of a fetch between them (only fetches lie between). Else g.
template <class Sched>
int fetch_issue_step(const Sched& sched, int g) {
  auto step = [&](int i) -> const Step& { return sched.steps[static_cast<std::size_t>(i)]; };
  int h = g - 1;
  while (h >= 1 && step(h).kind == EventKind::fetch) --h;
  if (h < 1) return g;
  const Step& a = step(h);
  if (a.kind != EventKind::forward && a.kind != EventKind::recompute && a.kind != EventKind::backward && a.kind != EventKind::loss)
    return g;
  for (int c = step(g).copy_begin; c < step(g).copy_end; ++c) {
    const CopyStep& cp = sched.copies[static_cast<std::size_t>(c)];
    if (touches(a, cp.to, cp.bytes)) return g;
    for (int x = h + 1; x < g; ++x)
      for (int d = step(x).copy_begin; d < step(x).copy_end; ++d) {
        const CopyStep& other = sched.copies[static_cast<std::size_t>(d)];
        if (other.to < cp.to + cp.bytes && cp.to < other.to + other.bytes) return g;
      }
  }
  return h;
}

}  // namespace headroom::cuda
