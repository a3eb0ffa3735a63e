#pragma once
// Reports of a plan, for people (host only, run time):
//
//   static constexpr auto p = headroom::plan<Run>();
//   std::cout << p;                                  // same as report(p)
//   headroom::write_svg(p, "plan.svg");              // live bytes over the step
//
// report(p)      a text table: the run, parameters, peak and lower bound per
//                tier (and the event where the bound is met), bytes by role,
//                bytes by layer (Repeat instances collapsed: layers.*.mlp),
//                FLOPs.
// report_svg(p)  a self-contained SVG: live bytes of one tier at every event,
//                stacked by role, with the step's phases, the arena peak, the
//                lower bound and the event where it is met.
// node_path(p, node, instance)  "layers.3.self_attn.q_proj" ("*" for instance < 0).
//
// Everything is linear in buffers + events (per-event live bytes come from a
// difference array, not buffers x events): an 8B model's plan (~5000
// buffers, ~2000 events) gives its table and its SVG in tens of milliseconds.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../graph/roles.hpp"
#include "plan.hpp"

namespace headroom {

namespace detail::reporting {
template <class T>
struct is_plan : std::false_type {};
template <std::size_t NB, std::size_t NE, std::size_t NN, std::size_t NP>
struct is_plan<Plan<NB, NE, NN, NP>> : std::true_type {};
}  // namespace detail::reporting

// ---- number formatting --------------------------------------------------------------------
// 1234567 -> "1,234,567"
inline std::string with_commas(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  const int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// Binary units, two decimals: "6.82 GiB", "512 B".
inline std::string human_bytes(std::int64_t b) {
  static constexpr std::array<const char*, 6> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  std::size_t u = 0;
  while (std::abs(v) >= 1024.0 && u + 1 < units.size()) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return std::to_string(b) + " B";
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << v << ' ' << units[u];
  return s.str();
}

namespace detail::reporting {
inline std::string decimal_units(double v, const char* const* units, std::size_t n, std::string_view suffix) {
  std::size_t u = 0;
  while (std::abs(v) >= 1000.0 && u + 1 < n) {
    v /= 1000.0;
    ++u;
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(u == 0 ? 0 : 2) << v;
  if (*units[u] != '\0' || !suffix.empty()) s << ' ' << units[u] << suffix;
  return s.str();
}
}  // namespace detail::reporting

// Decimal units, two decimals: "8.03 B", "41.94 M", "512".
inline std::string human_count(double v) {
  static constexpr const char* units[] = {"", "K", "M", "B", "T", "Q"};
  return detail::reporting::decimal_units(v, units, std::size(units), {});
}

// SI prefixes, two decimals: "95.73 TFLOP", "46.74 GFLOP".
inline std::string human_flops(double v) {
  static constexpr const char* units[] = {"", "k", "M", "G", "T", "P", "E"};
  return detail::reporting::decimal_units(v, units, std::size(units), "FLOP");
}

// ---- paths and events ------------------------------------------------------------------------
namespace detail::reporting {
template <class P>
constexpr bool is_repeat_node(const P& p, int n) {
  return p.nodes[n].is_repeat;
}
}  // namespace detail::reporting

// Dotted path of a node, Hugging Face style: "layers.3.self_attn.q_proj".
// The root is omitted ("model" for the root itself); a positional child is
// named by its index; at and below a Repeat the instance follows the
// Repeat's name ("layers.3" is block 3 as a whole), "*" when instance < 0
// (all instances). With pipeline parallelism a stage's instance j is block
// first_instance + j of the whole model, and is named so.
template <class P>
  requires detail::reporting::is_plan<P>::value
std::string node_path(const P& p, int node, int instance = -1) {
  const int nn = static_cast<int>(p.nodes.size());
  if (node < 0 || node >= nn) return "?";
  if (node == 0) return std::string(p.nodes[0].name);
  int chain[64];
  int depth = 0;
  for (int n = node; n > 0 && depth < 64; n = p.nodes[n].parent) chain[depth++] = n;
  std::string s;
  for (int k = depth - 1; k >= 0; --k) {
    const auto& nd = p.nodes[chain[k]];
    if (!s.empty()) s += '.';
    s += nd.index >= 0 ? std::to_string(nd.index) : std::string(nd.name);
    if (detail::reporting::is_repeat_node(p, chain[k])) {
      s += '.';
      s += instance < 0 ? std::string("*") : std::to_string(nd.first_instance + instance);
    }
  }
  return s;
}

// "backward layers.31.mlp.down_proj"; a fetch (OffloadParameters) names the
// op whose parameters it copies to the device and the event that reads them:
// "fetch layers.31.mlp.down_proj (for backward)"
template <class P>
  requires detail::reporting::is_plan<P>::value
std::string describe_event(const P& p, int e) {
  if (e < 0 || e >= static_cast<int>(p.events.size())) return "?";
  const auto& ev = p.events[e];
  std::string s(name_of(ev.kind));
  if (ev.kind == EventKind::prefetch) {  // names what comes back, not where it is issued
    if (ev.fetches < 0) return s + " (nothing: first block)";
    s += ' ';
    s += node_path(p, ev.node, ev.fetches);
  } else if (ev.node > 0) {
    s += ' ';
    s += node_path(p, ev.node, ev.instance);
  }
  if (ev.kind == EventKind::fetch && e + 1 < static_cast<int>(p.events.size())) {
    s += " (for ";
    s += name_of(p.events[e + 1].kind);
    s += ')';
  }
  return s;
}

namespace detail::reporting {

// The phase an event belongs to: 0 load, 1 forward, 2 loss, 3 backward
// (recompute / offload / prefetch included), 4 update. A fetch of parameters
// (OffloadParameters) is, like a prefetch, in the phase of where it stands:
// forward up to the loss event (the LM head's included), backward after.
inline constexpr std::array<std::string_view, 5> phase_names{"load", "forward", "loss", "backward", "update"};

template <class P>
int loss_event(const P& p) {
  int l = -1;
  for (int e = 0; e < static_cast<int>(p.events.size()); ++e)
    if (p.events[e].kind == EventKind::loss) l = e;
  return l;
}
template <class P>
int phase_of(const P& p, int e, int loss) {
  const EventKind k = p.events[e].kind;
  if (k == EventKind::load_batch) return 0;
  if (k == EventKind::update) return 4;
  if (k == EventKind::loss) return 2;
  return (loss >= 0 && e > loss) ? 3 : 1;
}

// Live bytes per role at every event of tier t: live[r][e]. One pass over the
// buffers into a difference array, one prefix sum per role.
template <class P>
std::vector<std::vector<std::int64_t>> live_by_role(const P& p, Tier t) {
  const int E = static_cast<int>(p.events.size());
  std::vector<std::vector<std::int64_t>> live(role_count, std::vector<std::int64_t>(E + 1, 0));
  for (const auto& b : p.buffers) {
    if (b.tier != t || b.first > b.last || b.first < 0 || b.first >= E) continue;
    auto& d = live[static_cast<int>(b.role)];
    d[b.first] += b.size;
    d[std::min(b.last + 1, E)] -= b.size;
  }
  for (auto& d : live) {
    for (int e = 1; e <= E; ++e) d[e] += d[e - 1];
    d.pop_back();
  }
  return live;
}

// A plain text table: first column left-aligned, the rest right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  void row(std::vector<std::string> r) { rows_.push_back(std::move(r)); }
  void rule() { rows_.emplace_back(); }
  void print(std::ostream& os, int indent = 2) const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (w.size() <= c) w.push_back(0);
        w[c] = std::max(w[c], r[c].size());
      }
    std::size_t total = 0;
    for (std::size_t c = 0; c < w.size(); ++c) total += w[c] + (c ? 2 : 0);
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const auto& r = rows_[i];
      os << std::string(indent, ' ');
      if (r.empty()) {
        os << std::string(total, '-') << '\n';
        continue;
      }
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (c == 0) os << std::left << std::setw(static_cast<int>(w[0])) << r[0];
        else os << "  " << std::right << std::setw(static_cast<int>(w[c])) << r[c];
      }
      os << std::left << '\n';
      if (i == 0) os << std::string(indent, ' ') << std::string(total, '-') << '\n';
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

inline std::string percent(double num, double den) {
  if (den <= 0) return "-";
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * num / den << '%';
  return s.str();
}

// Columns of the by-layer table, and the column each role adds to.
inline constexpr std::array<std::string_view, 6> layer_columns{"weights", "master", "grads", "opt state", "activations", "comm"};
constexpr int layer_column(Role r) {
  switch (r) {
    case Role::weights: case Role::quant_scales: return 0;
    case Role::master_weights: return 1;
    case Role::grads: return 2;
    case Role::optimizer_state: return 3;
    case Role::communication: return 5;  // gradient buckets, gathered parameters
    default: return 4;  // saved / transient / recomputed activations, their grads, scratch, batch io
  }
}
// A parameter's copy fetched to the device (OffloadParameters; graph/sharding.hpp
// fetch_params): role weights, no parameter of its own, on its op's node.
constexpr bool is_fetched_copy(const Buffer& b) { return b.role == Role::weights && b.name == "fetched"; }
// Whole-step tables shared by every parameter (code tables, 8-bit dynamic map).
constexpr bool is_shared_table(const Buffer& b) {
  return b.param < 0 && !is_fetched_copy(b) &&
         (b.role == Role::quant_scales || b.role == Role::optimizer_state || b.role == Role::weights ||
          b.role == Role::master_weights);
}

}  // namespace detail::reporting

// ---- the text report ---------------------------------------------------------------------------------
namespace detail::reporting {

// The heading: the model, the run, the layout, the parameters, the timeline.
template <class P>
void print_run(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const auto& c = p.config;
  const int E = static_cast<int>(p.events.size());
  const int NN = static_cast<int>(p.nodes.size());
  std::string model(p.nodes.empty() ? std::string_view("model") : p.nodes[0].kind);
  for (int n = 1; n < NN; ++n)
    if (rp::is_repeat_node(p, n) && p.nodes[n].parent == 0) {
      model += ", " + std::to_string(p.nodes[n].repeat) + " repeated blocks (" + node_path(p, n, 0) + ".." +
               std::to_string(p.nodes[n].first_instance + p.nodes[n].repeat - 1) + ")";
      break;
    }
  os << "headroom plan: " << model << '\n';
  os << "  run          batch " << c.batch << " x seq " << with_commas(c.seq) << " = " << with_commas(c.tokens())
     << " tokens per micro-batch";
  if (c.accumulate > 1) os << ", accumulate " << c.accumulate << " (" << with_commas(c.tokens() * c.accumulate) << " tokens per step)";
  else os << ", accumulate 1";
  os << '\n';
  // f32 master weights: a 16-bit run's, or an offloaded optimizer's planned for the CUDA engine (graph/builder.hpp make_param)
  const bool master = is_half(c.dtype) || (c.offload_optimizer && c.cuda());
  os << "               dtype " << name_of(c.dtype) << (master ? " (f32 master weights)" : "") << ", optimizer "
     << c.optim.name << " (" << c.optim.states << " state" << (c.optim.states == 1 ? "" : "s")
     << (c.optim.states > 0 ? ", " : "") << c.optim.storage << ")"
     << (c.update_in_backward ? ", update in backward" : "")
     << (!c.offload_optimizer ? ""
         : master ? ", optimizer offloaded (its state, the master weights and the gradients in the offload tier)"
                  : ", optimizer offloaded (its state and the gradients in the offload tier)")
     << (c.offload_params ? ", parameters offloaded (stored in the offload tier, fetched to the device before each event that "
                            "reads them)"
                          : "")
     << ", loss chunk " << c.loss_chunk << ", workers "
     << c.workers << '\n';
  if (c.pp > 1)
    os << "  pipeline     stage " << c.stage << " of " << c.pp << " (1F1B; " << c.in_flight() << " of " << c.accumulate
       << " micro-batches in flight, each with its copy of what forward keeps for backward)\n";
  if (c.dp > 1 || c.tp > 1) {
    static constexpr const char* sharded[] = {"nothing sharded", "optimizer states sharded", "optimizer states and gradients sharded",
                                              "optimizer states, gradients and parameters sharded"};
    os << "  layout       ";
    if (c.dp > 1) os << "data parallel over " << c.dp << " ranks, ZeRO " << c.zero << " (" << sharded[c.zero] << ")";
    if (c.dp > 1 && c.tp > 1) os << " x ";
    if (c.tp > 1) os << "tensor parallel over " << c.tp << " ranks (heads, feed-forward features and vocabulary split)";
    os << ": every figure below is one rank's\n";
  }
  const std::int64_t params = p.parameters(), trainable = p.trainable_parameters();
  os << "  parameters   total " << with_commas(params) << " (" << human_count(static_cast<double>(params)) << ")"
     << ", trainable " << with_commas(trainable) << " (" << human_count(static_cast<double>(trainable)) << ", "
     << rp::percent(static_cast<double>(trainable), static_cast<double>(params)) << ")\n";
  int fetches = 0;
  for (int e = 0; e < E; ++e) fetches += p.events[e].kind == EventKind::fetch;
  os << "  timeline     " << with_commas(E) << " events";
  if (fetches > 0) os << " (" << with_commas(fetches) << " fetches of parameters)";
  os << ", " << with_commas(static_cast<std::int64_t>(p.buffers.size())) << " buffers\n\n";
}

// Memory per tier: the arena, its lower bound, where the bound is reached.
template <class P>
void print_memory(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const int E = static_cast<int>(p.events.size());
  os << "memory\n";
  {
    rp::TextTable t({"", "device", "offload"});
    auto both = [&](auto f) { return std::vector<std::string>{f(Tier::device), f(Tier::offload)}; };
    auto row = [&](std::string name, std::vector<std::string> v) {
      v.insert(v.begin(), std::move(name));
      t.row(std::move(v));
    };
    row("arena peak", both([&](Tier x) { return human_bytes(p.peak_bytes(x)); }));
    row("lower bound (max live)", both([&](Tier x) { return human_bytes(p.lower_bound(x)); }));
    row("peak / lower bound", both([&](Tier x) {
          if (p.lower_bound(x) <= 0) return std::string("-");
          std::ostringstream s;
          s << std::fixed << std::setprecision(4) << static_cast<double>(p.peak_bytes(x)) / static_cast<double>(p.lower_bound(x));
          return s.str();
        }));
    row("arena bytes", both([&](Tier x) { return with_commas(p.peak_bytes(x)); }));
    t.print(os);
  }
  for (Tier x : {Tier::device, Tier::offload}) {
    if (p.lower_bound(x) <= 0) continue;
    const int e = p.lower_bound_event(x);
    os << "  " << name_of(x) << " bound at event " << with_commas(e) << " of " << with_commas(E) << " ("
       << rp::phase_names[rp::phase_of(p, e, rp::loss_event(p))] << "): " << describe_event(p, e) << '\n';
  }
  os << '\n';
}

// Bytes by role: totals over the step and what is alive at the bound.
template <class P>
void print_roles(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const int bound_e = p.lower_bound_event(Tier::device);
  std::array<std::int64_t, role_count> total_dev{}, total_off{}, at_bound{};
  for (const auto& b : p.buffers) {
    const int r = static_cast<int>(b.role);
    (b.tier == Tier::device ? total_dev : total_off)[r] += b.size;
    if (b.tier == Tier::device && b.alive_at(bound_e)) at_bound[r] += b.size;
  }
  const bool any_off = p.peak_bytes(Tier::offload) > 0;
  os << "bytes by role (reserved bytes; total = sum over all buffers of the step)\n";
  {
    std::vector<std::string> head{"role", "total (device)"};
    if (any_off) head.push_back("total (offload)");
    head.push_back("alive at bound (event " + std::to_string(bound_e) + ")");
    head.push_back("share of bound");
    rp::TextTable t(head);
    std::int64_t sd = 0, so = 0, sb = 0;
    for (int r = 0; r < role_count; ++r) {
      if (total_dev[r] == 0 && total_off[r] == 0) continue;
      std::vector<std::string> v{std::string(name_of(static_cast<Role>(r))), human_bytes(total_dev[r])};
      if (any_off) v.push_back(human_bytes(total_off[r]));
      v.push_back(human_bytes(at_bound[r]));
      v.push_back(rp::percent(static_cast<double>(at_bound[r]), static_cast<double>(p.lower_bound(Tier::device))));
      t.row(std::move(v));
      sd += total_dev[r];
      so += total_off[r];
      sb += at_bound[r];
    }
    t.rule();
    std::vector<std::string> v{"all", human_bytes(sd)};
    if (any_off) v.push_back(human_bytes(so));
    v.push_back(human_bytes(sb));
    v.push_back(rp::percent(static_cast<double>(sb), static_cast<double>(p.lower_bound(Tier::device))));
    t.row(std::move(v));
    t.print(os);
  }
  os << '\n';
}

// Bytes by layer: nodes grouped at the deepest level that keeps < 40 rows.
template <class P>
void print_layers(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const auto& c = p.config;
  const int NN = static_cast<int>(p.nodes.size());
  const int bound_e = p.lower_bound_event(Tier::device);
  {
    std::vector<int> depth(NN, 0);
    for (int n = 1; n < NN; ++n) depth[n] = p.nodes[n].parent >= 0 ? depth[p.nodes[n].parent] + 1 : 1;
    std::vector<char> owns(NN, 0);
    for (const auto& b : p.buffers)
      if (b.node >= 0 && b.node < NN) owns[b.node] = 1;
    const auto ancestor_at = [&](int n, int d) {
      while (n > 0 && depth[n] > d) n = p.nodes[n].parent;
      return n;
    };
    const int max_depth = NN > 0 ? *std::max_element(depth.begin(), depth.end()) : 0;
    int level = max_depth;
    for (; level > 1; --level) {
      std::vector<char> seen(NN, 0);
      int rows = 0;
      for (int n = 0; n < NN; ++n)
        if (owns[n] && !seen[ancestor_at(n, level)]) {
          seen[ancestor_at(n, level)] = 1;
          ++rows;
        }
      if (rows < 40) break;
    }
    constexpr int ncol = static_cast<int>(rp::layer_columns.size());
    // per group: [columns..., alive at bound, total]; row NN holds the shared tables
    std::vector<std::array<std::int64_t, ncol + 2>> acc(NN + 1, std::array<std::int64_t, ncol + 2>{});
    std::vector<char> used(NN + 1, 0);
    for (const auto& b : p.buffers) {
      const int g = rp::is_shared_table(b) ? NN : (b.node >= 0 && b.node < NN ? ancestor_at(b.node, level) : 0);
      acc[g][rp::layer_column(b.role)] += b.size;
      if (b.tier == Tier::device && b.alive_at(bound_e)) acc[g][ncol] += b.size;
      acc[g][ncol + 1] += b.size;
      used[g] = 1;
    }
    os << "bytes by layer (Repeat instances collapsed, both tiers; activations include their grads, scratch and batch io"
       << (c.offload_params ? "; weights include each copy fetched to the device" : "") << ")\n";
    std::vector<std::string> head{"layer"};
    for (auto h : rp::layer_columns) head.emplace_back(h);
    head.push_back("at bound");
    head.push_back("total");
    rp::TextTable t(head);
    std::array<std::int64_t, ncol + 2> sum{};
    for (int g = 0; g <= NN; ++g) {
      if (!used[g]) continue;
      std::string name = g == NN ? "(shared tables)" : g == 0 ? "(model: batch io)" : node_path(p, g, -1);
      std::vector<std::string> v{name};
      for (int k = 0; k < ncol + 2; ++k) {
        v.push_back(acc[g][k] ? human_bytes(acc[g][k]) : "-");
        sum[k] += acc[g][k];
      }
      t.row(std::move(v));
    }
    t.rule();
    std::vector<std::string> v{"all"};
    for (int k = 0; k < ncol + 2; ++k) v.push_back(human_bytes(sum[k]));
    t.row(std::move(v));
    t.print(os);
  }
  os << '\n';
}

// FLOPs of one micro-batch.
template <class P>
void print_flops(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const auto& c = p.config;
  const auto fmt_flops = [](std::int64_t f) { return with_commas(f) + "  (" + human_flops(static_cast<double>(f)) + ")"; };
  os << "flops (one micro-batch)\n";
  {
    rp::TextTable t({"", "FLOPs", "per token"});
    const double tok = static_cast<double>(c.tokens());
    auto row = [&](const char* name, std::int64_t f) {
      t.row({name, fmt_flops(f), human_flops(static_cast<double>(f) / tok)});
    };
    row("forward", p.flops_fwd);
    row("backward", p.flops_bwd);
    row("recompute", p.flops_recompute);
    t.rule();
    row("total", p.flops());
    t.print(os);
  }
}

// Communication per optimizer step, by collective (a parallel run).
template <class P>
void print_communication(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const auto& c = p.config;
  const Communication& m = p.communication;
  os << "\ncommunication (one rank, per optimizer step; sent: ring collectives over its group)\n";
  rp::TextTable t({"collective", "group", "calls", "payload", "sent per rank"});
  auto row = [&](const char* name, bool tensor, std::int64_t calls, std::int64_t bytes, double times) {
    if (calls == 0) return;
    const int ranks = tensor ? c.tp : c.dp;
    const double share = times * static_cast<double>(ranks - 1) / ranks;
    t.row({name, std::to_string(ranks) + (tensor ? " tensor" : " data"), with_commas(calls), human_bytes(bytes),
           human_bytes(static_cast<std::int64_t>(share * static_cast<double>(bytes)))});
  };
  row("all-reduce (gradients)", false, m.all_reduce_calls, m.all_reduce, 2);
  row("reduce-scatter (gradient buckets)", false, m.reduce_scatter_calls, m.reduce_scatter, 1);
  row(c.zero == 3 ? "all-gather (parameters, per event)" : "all-gather (weights after the update)", false, m.all_gather_calls,
      m.all_gather, 1);
  row("all-reduce (activations, their gradients)", true, m.tensor_all_reduce_calls, m.tensor_all_reduce, 2);
  row("all-gather (LM head row statistics)", true, m.tensor_all_gather_calls, m.tensor_all_gather, 1);
  row("all-reduce (LoRA matrices' gradients)", true, m.tensor_grad_all_reduce_calls, m.tensor_grad_all_reduce, 2);
  if (m.pipeline_sent + m.pipeline_received > 0)
    t.row({"send / receive (activations, their gradients)", std::to_string(c.pp) + " stages", "-",
           human_bytes(m.pipeline_sent + m.pipeline_received), human_bytes(m.pipeline_sent)});
  // the first and the last stage (2 ranks): a tied LM head's table, its gradient summed (sent once, received once)
  if (m.stage_all_reduce_calls > 0)
    t.row({"all-reduce (tied table's gradient)", "first, last stage", with_commas(m.stage_all_reduce_calls),
           human_bytes(m.stage_all_reduce), human_bytes(m.stage_all_reduce)});
  t.rule();
  const std::int64_t calls = m.all_reduce_calls + m.reduce_scatter_calls + m.all_gather_calls + m.tensor_all_reduce_calls +
                             m.tensor_all_gather_calls + m.tensor_grad_all_reduce_calls + m.stage_all_reduce_calls;
  t.row({"all", "", with_commas(calls),
         human_bytes(m.payload() + m.tensor_payload() + m.pipeline_sent + m.pipeline_received + m.stage_all_reduce),
         human_bytes(static_cast<std::int64_t>(m.sent_per_rank(c.dp) + m.tensor_sent_per_rank(c.tp)) + m.pipeline_sent +
                     m.stage_all_reduce)});
  t.print(os);
}

}  // namespace detail::reporting

template <class P>
  requires detail::reporting::is_plan<P>::value
void print(std::ostream& os, const P& p) {
  namespace rp = detail::reporting;
  const auto& c = p.config;
  const std::ios_base::fmtflags saved_flags = os.flags();
  rp::print_run(os, p);
  rp::print_memory(os, p);
  rp::print_roles(os, p);
  rp::print_layers(os, p);
  rp::print_flops(os, p);
  if (c.dp > 1 || c.tp > 1 || c.pp > 1) rp::print_communication(os, p);
  os.flags(saved_flags);
}

template <class P>
  requires detail::reporting::is_plan<P>::value
std::string report(const P& p) {
  std::ostringstream s;
  print(s, p);
  return s.str();
}

template <std::size_t NB, std::size_t NE, std::size_t NN, std::size_t NP>
std::ostream& operator<<(std::ostream& os, const Plan<NB, NE, NN, NP>& p) {
  print(os, p);
  return os;
}

// ---- the SVG picture ---------------------------------------------------------------------------------
namespace detail::reporting {

inline std::string xml_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

// Colours per role (Tableau-like, distinct), and the bottom-to-top stacking order:
// what lives the whole step first, then gradients, then what comes and goes.
inline constexpr std::array<const char*, role_count> role_colors{
    "#4e79a7",  // weights
    "#a0cbe8",  // quant scales
    "#76b7b2",  // master weights
    "#edc948",  // grads
    "#59a14f",  // optimizer state
    "#bab0ac",  // batch io
    "#e15759",  // saved activation
    "#ff9d9a",  // activation
    "#f28e2b",  // activation grad
    "#b07aa1",  // recompute
    "#9c755f",  // scratch
    "#86bcb6",  // communication
};
inline constexpr std::array<Role, role_count> stack_order{
    Role::weights,   Role::quant_scales,     Role::master_weights, Role::optimizer_state,
    Role::batch_io,  Role::grads,            Role::saved_activation, Role::recompute,
    Role::activation, Role::activation_grad, Role::scratch, Role::communication};
inline constexpr std::array<const char*, 5> phase_colors{"#e6e6e6", "#dce9f5", "#f4d4d4", "#fbe6cf", "#dcefd6"};

inline double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * mag;
}

// A coordinate: one decimal, no trailing ".0".
inline std::string num(double v) {
  char buf[48];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 1);
  std::string r(buf, ec == std::errc{} ? end : buf);
  if (r.size() > 2 && r.compare(r.size() - 2, 2, ".0") == 0) r.resize(r.size() - 2);
  if (r == "-0") r = "0";
  return r;
}

// Appends the points of a step polyline, dropping the middle of collinear runs.
struct Polyline {
  std::vector<std::pair<double, double>> pts;
  void add(double x, double y) {
    const std::size_t n = pts.size();
    if (n >= 1 && pts[n - 1].first == x && pts[n - 1].second == y) return;
    if (n >= 2 && ((pts[n - 1].second == y && pts[n - 2].second == y) || (pts[n - 1].first == x && pts[n - 2].first == x))) {
      pts[n - 1] = {x, y};
      return;
    }
    pts.emplace_back(x, y);
  }
};

}  // namespace detail::reporting

// Live bytes of tier t at every event, stacked by role. `title` replaces the
// default heading (model, batch x seq, dtype, optimizer). When buffers alive
// the whole step fill most of the picture (a quantized 8B model: weights are
// 80% of the bytes), a second panel zooms on the range where bytes change.
namespace detail::reporting {

// The memory chart report_svg draws: one tier's live bytes by role at
// every event (stacked areas, a column per pixel at most), the arena peak
// and the lower bound, the phases and the marked events below, a legend.
template <class P>
struct MemoryChart {
  struct Panel {
    double y0, y1;     // pixels
    double lo, hi;     // value range, in `unit`
    double step;       // gridline step, in `unit`
    bool labels;       // peak / bound / loss labels drawn here
    const char* clip;  // clip-path id
  };
  struct Run {
    int phase, a, z;  // events [a, z)
  };
  struct Mark {
    EventKind kind;
    const char* color;
  };
  static constexpr std::array<Mark, 4> marks{{{EventKind::recompute, "#7b4f9d"},
                                              {EventKind::offload, "#2f4b7c"},
                                              {EventKind::prefetch, "#00a2a8"},
                                              {EventKind::fetch, "#b8860b"}}};

  const P& p;
  Tier t;
  int E;
  decltype(live_by_role(std::declval<const P&>(), Tier::device)) live;
  std::vector<std::int64_t> total;
  std::array<bool, role_count> present{};
  std::int64_t peak, bound;
  int bound_e, loss;
  std::int64_t max_total = 0, min_total = 0, top_bytes = 1;
  const char* unit = "B";  // the largest binary unit the top reaches
  double scale = 1;
  // geometry: one panel, or an overview over a zoomed panel
  bool zoom = false;
  double W = 1280, H = 660, X0 = 90, X1 = 0, PW = 0, plot_top = 84, plot_bottom = 0;
  std::vector<Panel> panels;
  // buckets: at most one per pixel column; each shows its event with the most live bytes
  int nb = 1;
  std::vector<int> rep;
  std::vector<double> bx;
  std::vector<Run> runs;  // runs of one phase
  std::vector<Role> drawn;  // the roles drawn, bottom of the stack first
  std::vector<std::vector<std::int64_t>> cum;  // the stacked areas' edges, shared by the panels: top[k] of each drawn role
  bool steps = false;  // an event at least 2 px wide: areas drawn as steps
  std::array<bool, marks.size()> mark_present{};

  MemoryChart(const P& plan, Tier tier) : p(plan), t(tier), E(static_cast<int>(plan.events.size())), live(live_by_role(plan, tier)) {
    total.assign(E, 0);
    for (int r = 0; r < role_count; ++r)
      for (int e = 0; e < E; ++e) {
        total[e] += live[r][e];
        if (live[r][e] > 0) present[r] = true;
      }
    peak = p.peak_bytes(t);
    bound = p.lower_bound(t);
    bound_e = std::clamp(p.lower_bound_event(t), 0, std::max(E - 1, 0));
    loss = loss_event(p);
    max_total = E > 0 ? *std::max_element(total.begin(), total.end()) : 0;
    min_total = E > 0 ? *std::min_element(total.begin(), total.end()) : 0;
    top_bytes = std::max<std::int64_t>({peak, bound, max_total, 1});
    if (top_bytes >= (std::int64_t{1} << 30)) unit = "GiB", scale = double(std::int64_t{1} << 30);
    else if (top_bytes >= (std::int64_t{1} << 20)) unit = "MiB", scale = double(std::int64_t{1} << 20);
    else if (top_bytes >= (std::int64_t{1} << 10)) unit = "KiB", scale = 1024.0;
    const double top_u = static_cast<double>(top_bytes) / scale;
    zoom = static_cast<double>(min_total) > 0.55 * static_cast<double>(top_bytes);
    H = zoom ? 800 : 660;
    X1 = W - 250;
    PW = X1 - X0;
    plot_bottom = H - 96;
    {
      const double step = nice_step(top_u * 1.08, 6);
      const double hi = std::ceil(top_u * 1.08 / step) * step;
      if (!zoom) {
        panels.push_back({plot_top, plot_bottom, 0, hi, step, true, "hr-clip-0"});
      } else {
        const double y_split = plot_top + 0.32 * (plot_bottom - plot_top);
        panels.push_back({plot_top, y_split, 0, hi, nice_step(hi, 4), false, "hr-clip-0"});
        const double lo_u = static_cast<double>(min_total) / scale;
        const double zr = (top_u - lo_u) * 1.15 + top_u * 1e-3;
        const double zstep = nice_step(zr, 6);
        const double zlo = std::floor((lo_u - 0.05 * zr) / zstep) * zstep;
        const double zhi = std::ceil((top_u + 0.08 * zr) / zstep) * zstep;
        panels.push_back({y_split + 34, plot_bottom, std::max(0.0, zlo), zhi, zstep, true, "hr-clip-1"});
      }
    }
    nb = std::max(1, std::min(E, static_cast<int>(PW)));
    rep.assign(nb, 0);
    bx.assign(nb + 1, X0);
    for (int k = 0; k < nb; ++k) {
      const int a = static_cast<int>(static_cast<std::int64_t>(k) * E / nb);
      const int z = std::max(a + 1, static_cast<int>(static_cast<std::int64_t>(k + 1) * E / nb));
      int best = a;
      for (int e = a; e < z && e < E; ++e)
        if (total[e] > total[best]) best = e;
      if (bound_e >= a && bound_e < z) best = bound_e;  // the bound's event is always drawn
      rep[k] = std::min(best, std::max(E - 1, 0));
      bx[k] = xpix(a);
    }
    bx[nb] = X1;
    for (int e = 0; e < E; ++e) {
      const int ph = phase_of(p, e, loss);
      if (!runs.empty() && runs.back().phase == ph) runs.back().z = e + 1;
      else runs.push_back({ph, e, e + 1});
    }
    for (Role role : stack_order)
      if (present[static_cast<int>(role)]) drawn.push_back(role);
    cum.assign(drawn.size() + 1, std::vector<std::int64_t>(nb, 0));
    for (std::size_t i = 0; i < drawn.size(); ++i)
      for (int k = 0; k < nb; ++k) cum[i + 1][k] = cum[i][k] + live[static_cast<int>(drawn[i])][rep[k]];
    steps = nb > 0 && PW / nb >= 2.0;
    for (std::size_t m = 0; m < marks.size(); ++m)
      for (int e = 0; e < E; ++e) mark_present[m] = mark_present[m] || p.events[e].kind == marks[m].kind;
  }

  double xpix(double e) const { return X0 + (E > 0 ? e / E * PW : 0); }  // left edge of event e
  double ypix(const Panel& pn, double bytes) const { return pn.y1 - (bytes / scale - pn.lo) / (pn.hi - pn.lo) * (pn.y1 - pn.y0); }

  // The upper edge of a stack as a path: steps while an event is at least
  // 2 px wide, one point per pixel column otherwise; `close` runs it down to
  // the panel's bottom. Areas are painted from the top of the stack down,
  // each one to the bottom, so each path needs only its upper edge.
  std::string path_of(const std::vector<std::int64_t>& upper, const Panel& pn, bool close) const {
    Polyline a;
    for (int k = 0; k < nb; ++k) {
      const double y = std::min(ypix(pn, static_cast<double>(upper[k])), pn.y1 + 1);
      if (steps) {
        a.add(bx[k], y);
        a.add(bx[k + 1], y);
      } else {
        if (k == 0) a.add(bx[0], y);
        a.add((bx[k] + bx[k + 1]) / 2, y);
        if (k == nb - 1) a.add(bx[nb], y);
      }
    }
    std::string d;
    d.reserve(a.pts.size() * 14 + 32);
    bool first = true;
    for (const auto& pt : a.pts) {
      d += first ? "M" : " L";
      d += num(pt.first);
      d += ',';
      d += num(pt.second);
      first = false;
    }
    if (close) {
      d += " L" + num(X1) + ',' + num(pn.y1 + 1) + " L" + num(X0) + ',' + num(pn.y1 + 1) + " Z";
    }
    return d;
  }

  // The document's opening: size, background, the panels' clip paths.
  void open(std::ostringstream& s) const {
  s << R"(<svg xmlns="http://www.w3.org/2000/svg" width=")" << num(W) << R"(" height=")" << num(H) << R"(" viewBox="0 0 )" << num(W) << ' '
    << num(H) << R"(" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">)" << '\n';
  s << R"(<rect width="100%" height="100%" fill="white"/>)" << '\n';
  s << "<defs>";
  for (const auto& pn : panels)
    s << R"(<clipPath id=")" << pn.clip << R"("><rect x=")" << num(X0) << R"(" y=")" << num(pn.y0) << R"(" width=")" << num(PW)
      << R"(" height=")" << num(pn.y1 - pn.y0) << R"("/></clipPath>)";
  s << "</defs>\n";

  }

  // The title and the tier's figures.
  void title(std::ostringstream& s, std::string_view title) const {
    const auto& c = p.config;
  std::string heading(title);
  if (heading.empty()) {
    heading = std::string(p.nodes.empty() ? std::string_view("model") : p.nodes[0].kind);
    heading += ": batch " + std::to_string(c.batch) + " x seq " + std::to_string(c.seq);
    heading += ", " + std::string(name_of(c.dtype)) + ", " + std::string(c.optim.name);
  }
  s << R"(<text x=")" << num(X0) << R"(" y="28" font-size="18" font-weight="bold">)" << xml_escape(heading) << "</text>\n";
  std::ostringstream sub;
  sub << name_of(t) << " tier: arena peak " << human_bytes(peak) << ", lower bound " << human_bytes(bound);
  if (bound > 0)
    sub << " (peak / bound " << std::fixed << std::setprecision(4) << static_cast<double>(peak) / static_cast<double>(bound) << ")";
  sub << ", " << with_commas(E) << " events, " << with_commas(static_cast<std::int64_t>(p.buffers.size())) << " buffers";
  s << R"(<text x=")" << num(X0) << R"(" y="48" fill="#444">)" << xml_escape(sub.str()) << "</text>\n";
  if (bound > 0) {
    s << R"(<text x=")" << num(X0) << R"(" y="66" fill="#444">)"
      << xml_escape("max live at event " + std::to_string(bound_e) + ": " + describe_event(p, bound_e)) << "</text>\n";
  }

  }

  // Panel pi: the phase tint, the grid, the stacked areas, the loss and the
  // update, the peak and the bound.
  void panel(std::ostringstream& s, std::size_t pi) const {
  const Panel& pn = panels[pi];
  const double PH = pn.y1 - pn.y0;
  // phase tint
  for (const auto& r : runs) {
    const double xa = xpix(r.a), w = std::max(xpix(r.z) - xa, 2.0);
    s << R"(<rect x=")" << num(xa) << R"(" y=")" << num(pn.y0) << R"(" width=")" << num(w) << R"(" height=")" << num(PH)
      << R"(" fill=")" << phase_colors[r.phase] << R"(" opacity="0.45"/>)" << '\n';
  }
  // grid and y labels
  for (double v = pn.lo; v <= pn.hi + pn.step * 1e-6; v += pn.step) {
    const double y = pn.y1 - (v - pn.lo) / (pn.hi - pn.lo) * PH;
    s << R"(<line x1=")" << num(X0) << R"(" y1=")" << num(y) << R"(" x2=")" << num(X1) << R"(" y2=")" << num(y)
      << R"(" stroke="#000" stroke-opacity=")" << (v == 0 ? "0.6" : "0.12") << R"("/>)" << '\n';
    std::ostringstream lab;
    lab << std::setprecision(6) << std::round(v * 1000) / 1000;
    s << R"(<text x=")" << num(X0 - 8) << R"(" y=")" << num(y + 4) << R"(" text-anchor="end" fill="#333">)" << lab.str() << "</text>\n";
  }
  s << R"~(<text transform="translate(24 )~" << num((pn.y0 + pn.y1) / 2) << R"~() rotate(-90)" text-anchor="middle" fill="#333">)~"
    << (pi == 0 ? "live bytes (" : "live bytes, zoomed (") << unit << ")</text>\n";
  // areas
  s << R"~(<g clip-path="url(#)~" << pn.clip << R"~()">)~" << '\n';
  for (std::size_t i = drawn.size(); i-- > 0;) {
    const Role role = drawn[i];
    s << R"(<path fill=")" << role_colors[static_cast<int>(role)] << R"(" d=")" << path_of(cum[i + 1], pn, true)
      << R"("><title>)" << name_of(role) << "</title></path>\n";
  }
  s << R"(<path fill="none" stroke="#333" stroke-width="0.8" d=")" << path_of(cum.back(), pn, false) << R"("/>)" << '\n';
  s << "</g>\n";
  // loss / update
  for (int e = 0; e < E; ++e) {
    const EventKind k = p.events[e].kind;
    if (k != EventKind::loss && k != EventKind::update) continue;
    const double x = xpix(e + 0.5);
    s << R"(<line x1=")" << num(x) << R"(" y1=")" << num(pn.y0) << R"(" x2=")" << num(x) << R"(" y2=")" << num(pn.y1)
      << R"(" stroke="#555" stroke-dasharray="2 3"/>)" << '\n';
    if (pi == 0)  // above the frame, clear of the data
      s << R"(<text x=")" << num(x) << R"(" y=")" << num(pn.y0 - 4) << R"(" text-anchor="middle" fill="#555" font-size="11">)"
        << name_of(k) << "</text>\n";
  }
  // peak and bound lines, marker at the bound's event
  if (peak > 0) {
    const double yp = ypix(pn, static_cast<double>(peak)), yb = ypix(pn, static_cast<double>(bound));
    s << R"(<line x1=")" << num(X0) << R"(" y1=")" << num(yp) << R"(" x2=")" << num(X1) << R"(" y2=")" << num(yp)
      << R"(" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="8 4"/>)" << '\n';
    s << R"(<line x1=")" << num(X0) << R"(" y1=")" << num(yb) << R"(" x2=")" << num(X1) << R"(" y2=")" << num(yb)
      << R"(" stroke="#222" stroke-width="1.2" stroke-dasharray="2 3"/>)" << '\n';
    if (pn.labels) {
      const bool close = std::abs(yb - yp) < 14;
      s << R"(<text x=")" << num(X1 - 4) << R"(" y=")" << num(yp - 5)
        << R"(" text-anchor="end" fill="#c0392b" stroke="white" stroke-width="3" paint-order="stroke">arena peak )" << human_bytes(peak)
        << "</text>\n";
      s << R"(<text x=")" << num(close ? X0 + 4 : X1 - 4) << R"(" y=")" << num(close ? std::max(yb, yp) + 14 : yb - 5)
        << R"(" text-anchor=")" << (close ? "start" : "end")
        << R"(" fill="#222" stroke="white" stroke-width="3" paint-order="stroke">lower bound )" << human_bytes(bound) << "</text>\n";
    }
    if (bound > 0 && E > 0) {
      const double x = xpix(bound_e + 0.5);
      s << R"(<line x1=")" << num(x) << R"(" y1=")" << num(yb + 5) << R"(" x2=")" << num(x) << R"(" y2=")" << num(pn.y1)
        << R"(" stroke="#222" stroke-width="0.8" stroke-dasharray="1 2"/>)" << '\n';
      s << R"(<circle cx=")" << num(x) << R"(" cy=")" << num(yb) << R"(" r="5" fill="white" stroke="#222" stroke-width="2"/>)" << '\n';
    }
  }
  s << R"(<rect x=")" << num(X0) << R"(" y=")" << num(pn.y0) << R"(" width=")" << num(PW) << R"(" height=")" << num(PH)
    << R"(" fill="none" stroke="#666"/>)" << '\n';
  }

  // What the zoomed panel shows, drawn as a bracket on the overview.
  void zoom_bracket(std::ostringstream& s) const {
  // what the zoomed panel shows, drawn as a bracket on the overview
  const Panel& a = panels[0];
  const Panel& b = panels[1];
  const double ya = a.y1 - (b.lo - a.lo) / (a.hi - a.lo) * (a.y1 - a.y0), yz = a.y1 - (b.hi - a.lo) / (a.hi - a.lo) * (a.y1 - a.y0);
  s << R"(<rect x=")" << num(X1 + 3) << R"(" y=")" << num(std::max(yz, a.y0)) << R"(" width="5" height=")"
    << num(std::max(ya - std::max(yz, a.y0), 1.0)) << R"(" fill="#888"/>)" << '\n';
  s << R"(<text x=")" << num(X0) << R"(" y=")" << num(b.y0 - 10) << R"(" fill="#444">)"
    << xml_escape("zoom: " + num(b.lo) + " to " + num(b.hi) + " " + unit + " (grey bar beside the overview)")
    << "</text>\n";
  }

  // Event kinds worth marking: ticks in a strip below the plot, then the
  // phase band and the event axis.
  void event_strip(std::ostringstream& s) const {
  const double Y1 = panels.back().y1;
  const double strip_y = Y1 + 4, strip_h = 9;
  for (std::size_t m = 0; m < marks.size(); ++m) {
    int e = 0;
    while (e < E) {
      if (p.events[e].kind != marks[m].kind) {
        ++e;
        continue;
      }
      int z = e;
      while (z < E && p.events[z].kind == marks[m].kind) ++z;
      const double xa = xpix(e), w = std::max(xpix(z) - xa, 1.0);
      s << R"(<rect x=")" << num(xa) << R"(" y=")" << num(strip_y) << R"(" width=")" << num(w) << R"(" height=")" << num(strip_h)
        << R"(" fill=")" << marks[m].color << R"("/>)" << '\n';
      e = z;
    }
  }
  const double band_y = Y1 + 16, band_h = 20;
  for (const auto& r : runs) {
    const double xa = xpix(r.a), w = std::max(xpix(r.z) - xa, 2.0);
    s << R"(<rect x=")" << num(xa) << R"(" y=")" << num(band_y) << R"(" width=")" << num(w) << R"(" height=")" << num(band_h)
      << R"(" fill=")" << phase_colors[r.phase] << R"(" stroke="#999" stroke-width="0.5"/>)" << '\n';
    const std::string_view label = phase_names[r.phase];
    if (w > 8.0 * static_cast<double>(label.size()))
      s << R"(<text x=")" << num(xa + w / 2) << R"(" y=")" << num(band_y + 14) << R"(" text-anchor="middle" fill="#333">)" << label
        << "</text>\n";
  }
  if (E > 0) {
    const double xstep = std::max(1.0, nice_step(E, 10));
    for (double v = 0; v <= E; v += xstep) {
      const double x = xpix(v);
      s << R"(<line x1=")" << num(x) << R"(" y1=")" << num(band_y + band_h) << R"(" x2=")" << num(x) << R"(" y2=")"
        << num(band_y + band_h + 5) << R"(" stroke="#333"/>)" << '\n';
      s << R"(<text x=")" << num(x) << R"(" y=")" << num(band_y + band_h + 18) << R"(" text-anchor="middle" fill="#333">)"
        << static_cast<std::int64_t>(v) << "</text>\n";
    }
  }
  s << R"(<text x=")" << num((X0 + X1) / 2) << R"(" y=")" << num(band_y + band_h + 40)
    << R"(" text-anchor="middle" fill="#333">event of the training step (load batch, forward, loss, backward, update)</text>)" << '\n';

  }

  void legend(std::ostringstream& s) const {
  double ly = plot_top + 4;
  const double lx = X1 + 24;
  s << R"(<text x=")" << num(lx) << R"(" y=")" << num(ly) << R"(" font-weight="bold">role</text>)";
  s << R"(<text x=")" << num(W - 14) << R"(" y=")" << num(ly)
    << R"(" text-anchor="end" fill="#555" font-size="11">at max live</text>)" << '\n';
  ly += 10;
  for (auto it = drawn.rbegin(); it != drawn.rend(); ++it) {  // top of the stack first, as drawn
    const int r = static_cast<int>(*it);
    s << R"(<rect x=")" << num(lx) << R"(" y=")" << num(ly) << R"(" width="14" height="12" fill=")" << role_colors[r]
      << R"(" stroke="#555" stroke-width="0.5"/>)";
    s << R"(<text x=")" << num(lx + 20) << R"(" y=")" << num(ly + 10) << R"(">)" << name_of(*it) << "</text>";
    s << R"(<text x=")" << num(W - 14) << R"(" y=")" << num(ly + 10) << R"(" text-anchor="end" fill="#444" font-size="11">)"
      << (E > 0 ? human_bytes(live[r][bound_e]) : "-") << "</text>\n";
    ly += 18;
  }
  ly += 10;
  s << R"(<line x1=")" << num(lx) << R"(" y1=")" << num(ly + 6) << R"(" x2=")" << num(lx + 14) << R"(" y2=")" << num(ly + 6)
    << R"(" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="4 2"/>)";
  s << R"(<text x=")" << num(lx + 20) << R"(" y=")" << num(ly + 10) << R"(">arena peak (allocated)</text>)" << '\n';
  ly += 18;
  s << R"(<line x1=")" << num(lx) << R"(" y1=")" << num(ly + 6) << R"(" x2=")" << num(lx + 14) << R"(" y2=")" << num(ly + 6)
    << R"(" stroke="#222" stroke-width="1.2" stroke-dasharray="2 2"/>)";
  s << R"(<text x=")" << num(lx + 20) << R"(" y=")" << num(ly + 10) << R"(">lower bound (max live)</text>)" << '\n';
  ly += 18;
  s << R"(<circle cx=")" << num(lx + 7) << R"(" cy=")" << num(ly + 6) << R"(" r="4" fill="white" stroke="#222" stroke-width="2"/>)";
  s << R"(<text x=")" << num(lx + 20) << R"(" y=")" << num(ly + 10) << R"(">event of max live</text>)" << '\n';
  ly += 28;
  bool any_mark = false;
  for (std::size_t m = 0; m < marks.size(); ++m) {
    if (!mark_present[m]) continue;
    if (!any_mark) {
      s << R"(<text x=")" << num(lx) << R"(" y=")" << num(ly) << R"(" font-weight="bold">events</text>)" << '\n';
      ly += 10;
      any_mark = true;
    }
    s << R"(<rect x=")" << num(lx) << R"(" y=")" << num(ly + 2) << R"(" width="14" height="9" fill=")" << marks[m].color << R"("/>)";
    s << R"(<text x=")" << num(lx + 20) << R"(" y=")" << num(ly + 10) << R"(">)" << name_of(marks[m].kind) << "</text>\n";
    ly += 18;
  }
  }
};

}  // namespace detail::reporting

template <class P>
  requires detail::reporting::is_plan<P>::value
std::string report_svg(const P& p, Tier t = Tier::device, std::string_view title = {}) {
  const detail::reporting::MemoryChart<P> chart(p, t);
  std::ostringstream s;
  chart.open(s);
  chart.title(s, title);
  for (std::size_t pi = 0; pi < chart.panels.size(); ++pi) chart.panel(s, pi);
  if (chart.zoom) chart.zoom_bracket(s);
  chart.event_strip(s);
  chart.legend(s);
  s << "</svg>\n";
  return s.str();
}

// Writes report_svg(p, t, title) to `path`; throws std::runtime_error when the
// file cannot be written.
template <class P>
  requires detail::reporting::is_plan<P>::value
void write_svg(const P& p, const std::string& path, Tier t = Tier::device, std::string_view title = {}) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("headroom::write_svg: cannot open " + path);
  f << report_svg(p, t, title);
  if (!f) throw std::runtime_error("headroom::write_svg: cannot write " + path);
}

}  // namespace headroom
