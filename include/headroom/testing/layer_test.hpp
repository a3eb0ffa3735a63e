#pragma once
// testing::test_layer<L>(): checks a layer's kernels the way its users rely
// on them, on the host engine in f64.
//
//   auto r = headroom::testing::test_layer<MyBlock<8>>();
//   if (!r.passed) std::puts(r.report.c_str());
//
// The layer runs inside a probe model: an embedding feeds it
// (L::in_features per token, every token of the batch distinct, so the
// embedding table's gradient row of token i is the gradient of the layer's
// input at token i), and an LM head with cross-entropy reads it. One
// micro-batch runs forward and backward step by step, and:
//
//   1. every byte of the arena outside the buffers the plan has alive at
//      a step is poisoned before the step (0xFF bytes: NaN in f32 and f64),
//      and so are the buffers the step writes first; after the step, the
//      bytes outside its live buffers must still be poison (a kernel wrote
//      only where the plan gave it room), and what it wrote first must be
//      finite (it read nothing uninitialised: poison read turns into NaN);
//   2. the gradient of every trainable parameter, and of the layer's input,
//      is compared element by element with a central difference of the loss
//      (f64), after every trainable weight is set to small random values
//      (so that a zero-initialised factor, like LoRA's B, does not hide its
//      partner's gradient).
//
// Options: the probe's batch and sequence (Batch<B>, Seq<T>: defaults 2 and
// 4) and anything else Train accepts (Workers<W>, ...), as extra template
// arguments: test_layer<L, Batch<1>, Seq<8>>().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../headroom.hpp"
#include "../train/host/trainer.hpp"

namespace headroom::testing {

struct LayerTestOptions {
  double step = 1e-6;          // the central difference's step
  double tolerance = 1e-6;     // |analytic - numeric| <= tolerance * max(1, |numeric|)
  std::int64_t max_elements = 20000;  // elements checked per parameter; beyond, an even sample
  std::uint64_t seed = 7;
};

struct LayerTestResult {
  bool passed = true;
  std::int64_t elements_checked = 0;  // gradient elements compared
  int steps_checked = 0;              // steps run with a poisoned arena
  double max_error = 0;               // largest |analytic - numeric| / max(1, |numeric|)
  std::string report;                 // one line per failure (at most 20), then a summary
};

// The probe model: embedding -> L -> LM head + cross-entropy.
template <class L, std::int64_t V>
struct LayerProbe {
  static constexpr std::string_view kind = "LayerProbe";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  static constexpr std::int64_t D_in = L::in_features, D_out = L::out_features;
  static_assert(D_in > 0 && D_out > 0,
                "testing::test_layer<L>: L must read and write features (in_features and out_features > 0); embeddings and "
                "LM heads are checked inside the models that use them");
  using children = type_list<Embedding<V, D_in>, L, LMHeadLoss<V, D_out, false>>;
  static constexpr Ref build(graph::Builder& b, Ref tokens) {
    Ref x = b.child<Embedding<V, D_in>>("input", tokens);
    x = b.child<L>("layer", x);
    return b.child<LMHeadLoss<V, D_out, false>>("head", x);
  }
};

namespace detail {
template <class... O>
struct probe_shape {
  static constexpr std::int64_t batch = 2, seq = 4;
};
template <std::int64_t B, class... O>
struct probe_shape<Batch<B>, O...> : probe_shape<O...> {
  static constexpr std::int64_t batch = B;
};
template <std::int64_t T, class... O>
struct probe_shape<Seq<T>, O...> : probe_shape<O...> {
  static constexpr std::int64_t seq = T;
};
template <class X, class... O>
struct probe_shape<X, O...> : probe_shape<O...> {};

// The probe's run: Kept, then the options other than Batch and Seq (the shape
// comes first, from probe_shape).
template <class Probe, class Kept, class... O>
struct probe_run;
template <class Probe, class... K>
struct probe_run<Probe, type_list<K...>> {
  using type = Train<Probe, K...>;
};
template <class Probe, class... K, class X, class... O>
struct probe_run<Probe, type_list<K...>, X, O...> : probe_run<Probe, type_list<K..., X>, O...> {};
template <class Probe, class... K, std::int64_t B, class... O>
struct probe_run<Probe, type_list<K...>, Batch<B>, O...> : probe_run<Probe, type_list<K...>, O...> {};
template <class Probe, class... K, std::int64_t T, class... O>
struct probe_run<Probe, type_list<K...>, Seq<T>, O...> : probe_run<Probe, type_list<K...>, O...> {};

inline std::uint64_t next(std::uint64_t& s) {
  s += 0x9E3779B97F4A7C15ull;
  std::uint64_t z = s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline double uniform(std::uint64_t& s) { return static_cast<double>(next(s) >> 11) * (1.0 / 9007199254740992.0); }
}  // namespace detail

template <class L, class... Options>
LayerTestResult test_layer(LayerTestOptions o = {}) {
  using Shape = detail::probe_shape<Options...>;
  static constexpr std::int64_t tokens = Shape::batch * Shape::seq;
  static constexpr std::int64_t V = tokens + 3;  // every token of the batch distinct
  using Probe = LayerProbe<L, V>;
  using Run = typename detail::probe_run<Probe, type_list<Batch<Shape::batch>, Seq<Shape::seq>, Precision<F64>>, Options...>::type;
  using Tr = host::Trainer<Run>;
  static constexpr auto& plan = Tr::plan;
  static constexpr auto& sched = Tr::sched;

  LayerTestResult r;
  int failures = 0;
  std::string first_failure;
  auto fail = [&](const std::string& line) {
    r.passed = false;
    if (first_failure.empty()) first_failure = line;
    if (++failures <= 20) r.report += line + "\n";
  };
  auto number = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", x);
    return std::string(b);
  };

  Tr t(TrainOptions{.seed = o.seed});
  std::vector<std::int32_t> ids(tokens), targets(tokens);
  std::uint64_t rng = o.seed;
  for (std::int64_t i = 0; i < tokens; ++i) {
    ids[i] = static_cast<std::int32_t>(i);
    targets[i] = static_cast<std::int32_t>(detail::next(rng) % V);
  }
  // small random values in every trainable dense weight
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (!p.trainable || p.quant.kind != QuantKind::none) continue;
    double* w = t.weight(p);
    for (std::int64_t i = 0; i < p.elements(); ++i) w[i] = (detail::uniform(rng) - 0.5) * 0.5;
  }

  // ---- 1. one micro-batch, step by step, in a poisoned arena ----------------------------------------------------
  auto* base = reinterpret_cast<unsigned char*>(t.arena(Tier::device).data());
  const std::int64_t size = t.arena(Tier::device).bytes();
  std::vector<unsigned char> owned(static_cast<std::size_t>(size));
  auto mark = [&](int g, bool born_too) {  // 1: a buffer alive at step g (born before it, unless born_too)
    std::fill(owned.begin(), owned.end(), 0);
    for (const auto& b : plan.buffers)
      if (b.tier == Tier::device && b.alive_at(g) && (born_too || b.first < g || b.role == Role::batch_io))
        std::fill(owned.begin() + b.offset, owned.begin() + b.offset + b.bytes, 1);
    // a step that runs the next one in its epilogue writes that one's outputs
    // (the schedule fuses only where they overlap nothing step g uses), which
    // then hold their values when that step comes
    auto own = [&](const Step& st) {
      for (const Slot& s : st.out)
        if (s.bound()) std::fill(owned.begin() + s.offset, owned.begin() + s.offset + s.bytes, 1);
    };
    if (born_too && sched.steps[g].fuse_next) own(sched.steps[g + 1]);
    if (!born_too && sched.steps[g].fused_into_previous) own(sched.steps[g]);
  };
  t.load(ids, targets);
  const int end = sched.update_step >= 0 ? sched.update_step : static_cast<int>(sched.steps.size());
  for (int g = 1; g < end; ++g) {
    mark(g, false);
    for (std::int64_t i = 0; i < size; ++i)
      if (!owned[i]) base[i] = 0xFF;
    t.run_event(static_cast<std::size_t>(g));
    ++r.steps_checked;
    mark(g, true);
    const Step& st = sched.steps[g];
    const std::string where =
        "step " + std::to_string(g) + " (" + std::string(name_of(st.kind)) + " of " + Tr::node_path(st.node, st.instance) +
        (st.op.empty() ? std::string() : ", op '" + std::string(st.op) + "'") + ")";
    for (std::int64_t i = 0; i < size; ++i)
      if (!owned[i] && base[i] != 0xFF) {
        fail(where + " wrote byte " + std::to_string(i) + " of the arena, outside every buffer the plan has alive there");
        break;
      }
    for (const auto& b : plan.buffers) {
      if (b.tier != Tier::device || b.first != g || b.role == Role::scratch || b.role == Role::batch_io) continue;
      const double* v = reinterpret_cast<const double*>(base + b.offset);
      for (std::int64_t i = 0; i < b.bytes / 8; ++i)
        if (!std::isfinite(v[i])) {
          fail(where + " left element " + std::to_string(i) + " of its output '" + std::string(b.name) + "' at " + number(v[i]) +
               " (a read of memory nothing wrote, or a value out of range)");
          break;
        }
    }
  }

  // ---- 2. gradients against central differences ------------------------------------------------------------------
  std::vector<std::vector<double>> analytic(Tr::param_count);
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (!p.trainable) continue;
    const double* g = t.grad(p);
    analytic[k].assign(g, g + p.elements());
  }
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    if (!p.trainable) continue;
    double* w = t.weight(p);
    const std::string path = Tr::path_of(p);
    const bool input = path.rfind("input.", 0) == 0;  // the embedding: rows of the tokens used are the layer's input gradient
    const std::int64_t n = input ? tokens * p.cols : p.elements();
    const std::int64_t stride = n > o.max_elements ? (n + o.max_elements - 1) / o.max_elements : 1;
    for (std::int64_t i = 0; i < n; i += stride) {
      const double keep = w[i];
      w[i] = keep + o.step;
      const double up = t.evaluate(ids, targets);
      w[i] = keep - o.step;
      const double down = t.evaluate(ids, targets);
      w[i] = keep;
      const double numeric = (up - down) / (2 * o.step);
      const double err = std::abs(analytic[k][i] - numeric) / std::max(1.0, std::abs(numeric));
      r.max_error = std::max(r.max_error, err);
      ++r.elements_checked;
      if (!(err <= o.tolerance))
        fail((input ? "the layer's input gradient (token " + std::to_string(i / p.cols) + ", feature " +
                          std::to_string(i % p.cols) + ")"
                    : path + "[" + std::to_string(i / p.cols) + ", " + std::to_string(i % p.cols) + "]") +
             ": analytic " + number(analytic[k][i]) + ", numeric " + number(numeric));
    }
  }
  // The summary: what was checked, or, when something failed, the first
  // failure first (a failure of the arena checks leaves the gradient error
  // small, which must not read as a pass).
  const std::string checked = std::to_string(r.steps_checked) + " steps in a poisoned arena, " +
                              std::to_string(r.elements_checked) + " gradient elements, largest relative error " +
                              number(r.max_error) + " (tolerance " + number(o.tolerance) + ")";
  if (r.passed) {
    r.report += "passed: " + checked;
  } else {
    r.report += "FAILED: " + first_failure;
    if (failures > 1)
      r.report += " (and " + std::to_string(failures - 1) + " more failure" + (failures > 2 ? "s" : "") +
                  (failures > 20 ? ", " + std::to_string(failures - 20) + " of them not shown" : "") + ")";
    r.report += "; checked " + checked;
  }
  return r;
}

}  // namespace headroom::testing
