#pragma once
// The plan of one training step, computed at compile time:
//
//   constexpr auto plan = headroom::plan<Run>();
//   static_assert(plan.peak_bytes() <= 24_GiB);
//   static_assert(headroom::fits<Run, 24_GiB>);   // the same, naming both numbers when it fails (plan/budget.hpp)
//
// Steps (all constexpr):
//   1. build   the model's graph (graph/: graph::StepBuilder): ops, tensors, events, endpoints;
//   2. expand  groups (Repeat) into the global timeline: event e of instance j
//              of a group sits at base[e] + j * stride[e] (stride < 0 in backward)
//              (plan/expand.hpp), and count FLOPs and communication (plan/accounting.hpp);
//   3. resolve each tensor instance to one buffer with [first, last] events (plan/expand.hpp);
//   4. pack    (plan/pack.hpp) each tier: a sweep in birth order, best-fit into the gaps left by
//              dead buffers, with gradients (born in backward, alive to the
//              update) packed from the top of the arena so they meet the
//              activations they replace instead of fragmenting them;
//   5. check   that no two buffers alive at one event overlap, and compute the
//              liveness lower bound (max over events of the bytes alive).
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

#include "../graph/backward.hpp"
#include "../run.hpp"
#include "accounting.hpp"
#include "expand.hpp"
#include "pack.hpp"

namespace headroom {

namespace detail {

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

// Expands graph b into buffers with lifetimes and the step's figures; with
// Pack, also places each tier's buffers (the plan), else leaves offsets 0.
template <bool Pack = true>
constexpr Expanded expand_graph(const graph::Graph& b) {
  Expanded x;
  x.cfg = b.cfg;
  const Timeline tl = expand_events(b);
  describe(x, b, tl);
  const int loss_event = forward_end(x);
  account(x, b);
  resolve_buffers(x, b, tl, loss_event);
  if constexpr (Pack) pack_tiers(x, loss_event);
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
  // the schedule's (plan/schedule.hpp): one step per event, copies, one slot per parameter instance
  std::size_t copies = 0, param_slots = 0;
};

// Array sizes of R's plan and of its schedule, from the graph alone (no
// resolution, no packing).
template <class R>
constexpr Sizes sizes() {
  const graph::Graph b = build_graph<R>();
  const std::size_t buffers = buffer_count(b);
  std::int64_t parameters = 0, trainable = 0;
  std::size_t param_slots = 0;
  for (const auto& pr : b.params) {
    const int instances = b.instances(pr.group);
    const std::int64_t n = pr.rows * pr.cols * instances;
    parameters += n;
    if (pr.trainable) trainable += n;
    param_slots += static_cast<std::size_t>(instances);
  }
  // each copy is made once per instance on the way out and once on the way back
  std::size_t copies = 0;
  for (const auto& c : b.copies) {
    const int g = b.tensors[c.src].group;
    copies += 2 * static_cast<std::size_t>(b.instances(g));
  }
  // OffloadParameters: each fetch copies its parameters once per instance
  for (std::size_t e = 0; e < b.events.size(); ++e) {
    if (b.events[e].kind != EventKind::fetch) continue;
    const int g = b.events[e].group;
    for (const graph::Ref& r : b.bindings[e].out)
      if (r.valid()) copies += static_cast<std::size_t>(b.instances(g));
  }
  return Sizes{buffers,   static_cast<std::size_t>(expand_events(b).total), b.nodes.size(), b.params.size(), parameters,
               trainable, b.tied_table_missing, copies, param_slots};
}
// Evaluated once per run type: the plan and the schedule both read it.
template <class R>
inline constexpr Sizes sizes_of = sizes<R>();

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
  constexpr detail::Sizes n = detail::sizes_of<R>;
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
