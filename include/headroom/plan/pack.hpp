#pragma once
// Steps 4 and 5 of a plan (plan/plan.hpp): each tier's buffers placed in
// one arena, and the check that no two buffers alive at one event overlap.
#include <algorithm>
#include <cstdint>

#include "../core/bit_tree.hpp"
#include "expand.hpp"

namespace headroom {

namespace detail {

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
//   O  the rest: swept in birth order, the O buffers alive kept in a set
//      ordered by offset (a BitTree over the ranks of their offsets); the
//      set is pairwise disjoint (each member was checked on entry), so a new
//      buffer overlaps one of them exactly when it overlaps its neighbour
//      below or above. Each O buffer is also checked against the L buffers
//      it overlaps in space (found by binary search), which must be born
//      after it dies. A buffer of no bytes overlaps nothing.
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
  // each O buffer's rank: the position of its offset among the O buffers'
  // (equal offsets, equal ranks)
  const int m = static_cast<int>(rest.size());
  cvec<int> rank_v(static_cast<std::size_t>(n), 0), owner_v(static_cast<std::size_t>(m), -1);
  int* rank = rank_v.begin();
  int* owner = owner_v.begin();  // the live O buffer at a rank
  {
    cvec<int> by_offset = rest;
    sort_by_key(by_offset, s.offset);
    const int* o = by_offset.begin();
    for (int k = 0; k < m; ++k) rank[o[k]] = k > 0 && offset[o[k]] == offset[o[k - 1]] ? rank[o[k - 1]] : k;
  }
  sort_by_birth(rest, s, events);
  // the O buffers entered so far, listed by their last event
  cvec<int> dies_head_v(static_cast<std::size_t>(events), -1), dies_next_v(static_cast<std::size_t>(n), -1);
  int* dies_head = dies_head_v.begin();
  int* dies_next = dies_next_v.begin();
  int freed_through = -1;  // every entered buffer whose last event is at most this one has left
  BitTree live(m);         // ranks of the O buffers alive at the current birth
  for (int i : rest) {
    const int born = first[i];
    for (int e = freed_through + 1; e < born; ++e)
      for (int j = dies_head[e]; j >= 0; j = dies_next[j]) live.erase(rank[j]);
    if (born - 1 > freed_through) freed_through = born - 1;
    const std::int64_t lo = offset[i], hi = lo + size[i];
    if (lo < floor) return false;  // would overlap a whole-step buffer
    if (size[i] == 0) continue;    // no bytes: overlaps nothing, stays out of the set
    const int r = rank[i];
    if (live.contains(r)) return false;  // alive together at the same offset
    const int below = live.prev(r - 1), above = live.next(r + 1);
    if (below >= 0 && offset[owner[below]] + size[owner[below]] > lo) return false;
    if (above >= 0 && offset[owner[above]] < hi) return false;
    live.insert(r);
    owner[r] = i;
    dies_next[i] = dies_head[last[i]];
    dies_head[last[i]] = i;
    // the first tail buffer ending after lo, then every one starting before hi
    std::size_t a = 0, z = nt;
    while (a < z) {
      const std::size_t mid = (a + z) / 2;
      if (offset[t[mid]] + size[t[mid]] <= lo) a = mid + 1;
      else z = mid;
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

// Places the buffers of each tier (x.buffers' offsets) and bounds it: the
// arena (x.peak, the better of two tie-breaks), the check, and the liveness
// lower bound with its event.
constexpr void pack_tiers(Expanded& x, int loss_event) {
  const int E = static_cast<int>(x.events.size());
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
    x.valid = x.valid && check(spans, x.peak[tier], E, x.cfg.alignment);
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

constexpr bool detail::Expanded::recheck() const {
  return detail::recheck(buffers, peak, static_cast<int>(events.size()));
}
}  // namespace detail
}  // namespace headroom
