#pragma once
// fit_budget: the run with the least extra cost that fits a memory budget,
// found at compile time by the planner itself.
//
//   using Base = Train<models::Llama<models::llama3_8b>, Batch<2>, Seq<2048>, Precision<BF16>, OnCuda>;
//   using Found = fit_budget<Base, 24_GiB,
//                            Variants<Variant<Keep>,                                      // full fine-tuning, as written
//                                     Variant<AdamW8bit>,                                 // 8-bit optimizer states
//                                     Variant<Keep, Apply<LoRA<8>, On<q_proj, v_proj>>>>, // LoRA
//                            SearchOptions{.offload_optimizer = true, .offload_budget = 64_GiB}>;
//   using R = Found::run;                      // a Train<...> to train
//   static_assert(Found::choice.peak <= 24_GiB);
//   std::cout << report(Found::result);        // what was planned, and why this one
//
// What may change, and in which order it is tried:
//   - the variants, in the user's order of preference: each replaces the
//     run's optimizer (or keeps it: Keep) and adds recipes (LoRA, Quantized,
//     ...) to the model. The first variant with a run that fits is taken:
//     a variant changes what is trained, which no cost below can weigh.
//   - within a variant, the remedies SearchOptions allows, each at its cost
//     per optimizer step in seconds (the least is taken):
//       nothing                                 0
//       Apply<Checkpointed<>, On<mlp_act>>      its recompute FLOPs / flops_per_second
//       Apply<Checkpointed<>, FirstBlocks<k>>   (k = 1 .. blocks - 1) the same
//       Apply<Checkpointed<>, EveryBlock>       the same
//     each with or without OffloadOptimizer (optimizer state, master weights
//     and gradients in the offload tier, within offload_budget), which adds
//     2 x trainable parameters x the run's element size moved over the host
//     link per step (gradients out, weights back) / link_bytes_per_second.
//
// How few plans it makes (a Llama-3-8B plan takes 3.5 s to g++): for each
// variant and offload setting,
//   1. the run without remedies; when its weights, master weights and
//      optimizer state alone exceed the budget, nothing more;
//   2. the MLP-activation recompute: the cheapest (5 or 8 FLOPs per
//      (tokens, ffn) element per block, below one block's recompute
//      whenever 6 x dim > 5 x blocks), skipped when the budget is further
//      below than every block's (tokens, ffn) activation, the most it saves;
//   3. every block checkpointed; if that fits, FirstBlocks<k> at the k the
//      two ends predict (the peak falls about linearly with k), then k - 1,
//      k - 2, ... down while they fit, or k + 1, ... up until one does (the
//      peak does not grow with k).
// Offloading is planned only when its bytes moved could cost less than the
// best run without it. A 24 GiB search of Llama-3-8B (docs/from-python.md)
// makes 7 plans in 24 s. The result lists every plan made; tests check the
// choice against planning every candidate of a small model.
#include <array>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "../core/diagnostic.hpp"
#include "../layers/ops_of.hpp"
#include "../models/gpt2.hpp"
#include "../models/llama.hpp"
#include "../policies/apply.hpp"
#include "../run.hpp"
#include "plan.hpp"

namespace headroom {

struct Keep {};  // a Variant that keeps the run's optimizer
template <class Optimizer, class... Recipes>
struct Variant {};
template <class... Vs>
struct Variants {};

struct SearchOptions {
  bool checkpoint_blocks = true;     // Checkpointed<> on the first k blocks, or on every block
  bool recompute_activation = true;  // Checkpointed<> on the MLP's activation (On<mlp_act>)
  bool offload_optimizer = false;    // OffloadOptimizer, within offload_budget
  std::int64_t offload_budget = 0;   // bytes of the offload tier (host memory or disk)
  // The cost model: seconds per step = recompute FLOPs / flops_per_second +
  // bytes moved to and from the offload tier / link_bytes_per_second.
  // Defaults: an A100's bf16 dense peak at the efficiency Megatron-LM reached
  // (312 TFLOP/s x 0.44, plan/step_time.hpp's dgx_a100), and PCIe 4.0 x16.
  std::int64_t flops_per_second = 137'280'000'000'000;
  std::int64_t link_bytes_per_second = 25'000'000'000;
};

enum class Remedy : std::uint8_t { none, mlp_act, first_blocks, every_block };

constexpr std::string_view name_of(Remedy r) {
  switch (r) {
    case Remedy::none: return "nothing";
    case Remedy::mlp_act: return "Apply<Checkpointed<>, On<mlp_act>>";
    case Remedy::first_blocks: return "Apply<Checkpointed<>, FirstBlocks<k>>";
    case Remedy::every_block: return "Apply<Checkpointed<>, EveryBlock>";
  }
  return "";
}

// One planned run of the search.
struct Candidate {
  int variant = -1;
  Remedy remedy = Remedy::none;
  int blocks = 0;  // FirstBlocks<blocks>; the model's blocks for every_block
  bool offload = false;
  std::int64_t peak = 0, offload_peak = 0;  // plan bytes of the device and offload tiers
  std::int64_t recompute_flops = 0, moved_bytes = 0;
  std::int64_t trainable = 0;  // trainable parameters (elements)
  std::int64_t model_states = 0;  // device bytes no activation remedy changes (Figures::model_states)
  double seconds = 0;  // extra cost per optimizer step
  bool fits = false;
  constexpr bool planned() const { return variant >= 0; }
};

struct SearchResult {
  static constexpr int max_plans = 32;
  std::array<Candidate, max_plans> planned{};
  int plans = 0;
  Candidate choice{};  // choice.fits is false when nothing fits
  std::int64_t budget = 0, offload_budget = 0;
  constexpr void add(const Candidate& c) {
    if (plans < max_plans) planned[static_cast<std::size_t>(plans++)] = c;
  }
  // the candidate with the smallest peak among those planned (what the error names)
  constexpr Candidate smallest() const {
    Candidate s{};
    for (int i = 0; i < plans; ++i)
      if (!s.planned() || planned[static_cast<std::size_t>(i)].peak < s.peak) s = planned[static_cast<std::size_t>(i)];
    return s;
  }
};

namespace search {

// ---- models: adding recipes, counting blocks ---------------------------------------------
// A user's own model template joins by specializing these two.
template <class M, class... More>
struct with_recipes;
template <models::LlamaConfig C, class... Ms, class... More>
struct with_recipes<models::Llama<C, Ms...>, More...> {
  using type = models::Llama<C, Ms..., More...>;
};
template <models::GPT2Config C, class... Ms, class... More>
struct with_recipes<models::GPT2<C, Ms...>, More...> {
  using type = models::GPT2<C, Ms..., More...>;
};
template <class M>
constexpr int block_count() {
  return static_cast<int>(M::config.layers);
}
// The MLP's hidden width (what On<mlp_act> stops keeping: (tokens, ffn) per block).
template <class M>
constexpr std::int64_t mlp_width() {
  if constexpr (requires { M::config.ffn; }) return M::config.ffn;
  else return 4 * M::config.dim;  // GPT-2
}

// ---- the run of a candidate ---------------------------------------------------------------------
template <Remedy R, int K>
struct remedy_recipes {
  using type = type_list<>;
};
template <int K>
struct remedy_recipes<Remedy::mlp_act, K> {
  using type = type_list<Apply<Checkpointed<>, On<mlp_act>>>;
};
template <int K>
struct remedy_recipes<Remedy::first_blocks, K> {
  using type = type_list<Apply<Checkpointed<>, FirstBlocks<K>>>;
};
template <int K>
struct remedy_recipes<Remedy::every_block, K> {
  using type = type_list<Apply<Checkpointed<>, EveryBlock>>;
};

template <class M, class List>
struct add_list;
template <class M, class... Rs>
struct add_list<M, type_list<Rs...>> {
  using type = typename with_recipes<M, Rs...>::type;
};

// Train<M', Options'...>: the run's options without its optimizer, then the
// variant's optimizer (or the run's), then OffloadOptimizer when asked.
template <class... Os>
using options_without_optimizer = typename detail::concat<std::conditional_t<Optimizer<Os>, type_list<>, type_list<Os>>...>::type;
template <class M, class Options>
struct train_of;
template <class M, class... Os>
struct train_of<M, type_list<Os...>> {
  using type = Train<M, Os...>;
};

template <class Run, class V, Remedy R, int K, bool Offload>
struct candidate_run;
template <class M, class... Os, class Opt, class... Recipes, Remedy R, int K, bool Offload>
struct candidate_run<Train<M, Os...>, Variant<Opt, Recipes...>, R, K, Offload> {
  using optimizer = std::conditional_t<std::is_same_v<Opt, Keep>, typename Train<M, Os...>::optimizer, Opt>;
  using model = typename add_list<typename with_recipes<M, Recipes...>::type, typename remedy_recipes<R, K>::type>::type;
  using options = typename detail::concat<options_without_optimizer<Os...>,
                                          type_list<optimizer>,
                                          std::conditional_t<Offload, type_list<OffloadOptimizer>, type_list<>>>::type;
  using type = typename train_of<model, options>::type;
};

// ---- one candidate, planned (once per run type, whatever the budget) ------------------------------
struct Figures {
  std::int64_t peak = 0, offload_peak = 0, recompute_flops = 0, trainable = 0, element_bytes = 0;
  // what no activation remedy changes: the device's weights, scales, master
  // weights and optimizer state (with OffloadParameters the weights are
  // fetched per event: then 0, no floor is assumed)
  std::int64_t model_states = 0;
};
template <class Run>
constexpr Figures measure() {
  const auto p = plan<Run>();
  const std::int64_t states = Run::offload_params ? 0
                                                  : p.bytes(Role::weights, Tier::device) + p.bytes(Role::quant_scales, Tier::device) +
                                                        p.bytes(Role::master_weights, Tier::device) +
                                                        p.bytes(Role::optimizer_state, Tier::device);
  return Figures{p.peak_bytes(Tier::device), p.peak_bytes(Tier::offload), p.flops_recompute, p.trainable_parameters(),
                 size_of(Run::dtype), states};
}
template <class Run>
inline constexpr Figures figures = measure<Run>();

template <int V, Remedy R, int K, bool Offload, std::int64_t Budget, SearchOptions O>
constexpr Candidate candidate(const Figures& f) {
  Candidate c;
  c.variant = V;
  c.remedy = R;
  c.blocks = K;
  c.offload = Offload;
  c.peak = f.peak;
  c.offload_peak = f.offload_peak;
  c.recompute_flops = f.recompute_flops;
  c.trainable = f.trainable;
  c.model_states = f.model_states;
  c.moved_bytes = Offload ? 2 * f.trainable * f.element_bytes : 0;
  c.seconds = static_cast<double>(c.recompute_flops) / static_cast<double>(O.flops_per_second) +
              static_cast<double>(c.moved_bytes) / static_cast<double>(O.link_bytes_per_second);
  c.fits = c.peak <= Budget && (!Offload || c.offload_peak <= O.offload_budget);
  return c;
}

// The search's fixed parameters for one variant and offload setting.
template <class Run, class V, int Index, bool Offload, std::int64_t Budget, SearchOptions O>
struct Setting {
  template <Remedy R, int K>
  static constexpr Candidate at() {
    return candidate<Index, R, K, Offload, Budget, O>(figures<typename candidate_run<Run, V, R, K, Offload>::type>);
  }
  static constexpr int blocks = block_count<typename Run::model>();
  static constexpr std::int64_t budget = Budget;
  // the most On<mlp_act> can take off the peak: every block's (tokens, ffn) activation
  static constexpr std::int64_t activation_bytes =
      blocks * Run::batch * Run::seq * mlp_width<typename Run::model>() * size_of(Run::dtype);
};

// The plans of one stretch of the search, and the best fitting candidate among them.
struct Trail {
  std::array<Candidate, SearchResult::max_plans> planned{};
  int plans = 0;
  Candidate best{};
  constexpr void add(const Candidate& c) {
    if (plans < SearchResult::max_plans) planned[static_cast<std::size_t>(plans++)] = c;
  }
  constexpr void add(const Trail& t) {
    for (int i = 0; i < t.plans; ++i) add(t.planned[static_cast<std::size_t>(i)]);
  }
};

// FirstBlocks<K> fits: the fewest blocks that still fit, walking down.
template <class S, int K>
constexpr void walk_down(Trail& t) {
  if constexpr (K > 1) {
    constexpr Candidate c = S::template at<Remedy::first_blocks, K - 1>();
    t.add(c);
    if constexpr (c.fits) {
      t.best = c;
      walk_down<S, K - 1>(t);
    }
  }
}
// FirstBlocks<K> does not fit: the first that does, walking up (EveryBlock, planned already, at the end).
template <class S, int K>
constexpr void walk_up(Trail& t, const Candidate& every) {
  if constexpr (K + 1 >= S::blocks) {
    t.best = every;
  } else {
    constexpr Candidate c = S::template at<Remedy::first_blocks, K + 1>();
    t.add(c);
    if constexpr (c.fits) t.best = c;
    else walk_up<S, K + 1>(t, every);
  }
}

// The cheapest fitting run of one variant and offload setting (best.fits false: none).
template <class S, SearchOptions O>
constexpr Trail cheapest() {
  Trail t;
  constexpr Candidate none = S::template at<Remedy::none, 0>();
  t.add(none);
  if constexpr (none.fits) {
    t.best = none;
    return t;
  } else {
    if constexpr (none.model_states > S::budget) return t;  // the model's states alone do not fit
    if constexpr (O.recompute_activation && none.peak - S::activation_bytes <= S::budget) {
      constexpr Candidate act = S::template at<Remedy::mlp_act, 0>();
      t.add(act);
      if constexpr (act.fits) {
        t.best = act;
        return t;
      }
    }
    if constexpr (O.checkpoint_blocks) {
      constexpr Candidate every = S::template at<Remedy::every_block, S::blocks>();
      t.add(every);
      if constexpr (!every.fits || S::blocks < 2) {
        if constexpr (every.fits) t.best = every;
      } else {
        // the peak falls about linearly with k: the k the two ends predict
        constexpr std::int64_t drop = none.peak - every.peak, over = none.peak - S::budget;
        constexpr std::int64_t guess = drop > 0 ? (over * S::blocks + drop - 1) / drop : S::blocks;
        constexpr int k = static_cast<int>(guess < 1 ? 1 : guess > S::blocks - 1 ? S::blocks - 1 : guess);
        constexpr Candidate first = S::template at<Remedy::first_blocks, k>();
        t.add(first);
        if constexpr (first.fits) {
          t.best = first;
          walk_down<S, k>(t);
        } else {
          walk_up<S, k>(t, every);
        }
      }
    }
    return t;
  }
}

// One variant: without offloading, then with it where it could cost less.
template <class Run, class V, int I, std::int64_t Budget, SearchOptions O>
constexpr Trail variant_trail() {
  using Local = Setting<Run, V, I, false, Budget, O>;
  constexpr Trail local = cheapest<Local, O>();
  constexpr Candidate plain = Local::template at<Remedy::none, 0>();
  constexpr double floor = static_cast<double>(2 * plain.trainable * size_of(Run::dtype)) / static_cast<double>(O.link_bytes_per_second);
  if constexpr (O.offload_optimizer && (!local.best.fits || floor < local.best.seconds)) {
    constexpr Trail off = cheapest<Setting<Run, V, I, true, Budget, O>, O>();
    Trail t = local;
    t.add(off);
    if (off.best.fits && (!local.best.fits || off.best.seconds < local.best.seconds)) t.best = off.best;
    return t;
  } else {
    return local;
  }
}

template <class Run, std::int64_t Budget, SearchOptions O, int I, class V, class... Rest>
constexpr void search_from(SearchResult& r) {
  constexpr Trail t = variant_trail<Run, V, I, Budget, O>();
  for (int i = 0; i < t.plans; ++i) r.add(t.planned[static_cast<std::size_t>(i)]);
  if constexpr (t.best.fits) r.choice = t.best;
  else if constexpr (sizeof...(Rest) > 0) search_from<Run, Budget, O, I + 1, Rest...>(r);
}

template <class Run, std::int64_t Budget, class Vs, SearchOptions O>
struct searched;
template <class Run, std::int64_t Budget, class... Vs, SearchOptions O>
struct searched<Run, Budget, Variants<Vs...>, O> {
  static_assert(sizeof...(Vs) > 0, "fit_budget<Run, Budget, Variants<...>>: give at least one Variant (Variant<Keep>: the run as written)");
  static constexpr SearchResult result = [] {
    SearchResult r;
    r.budget = Budget;
    r.offload_budget = O.offload_budget;
    search_from<Run, Budget, O, 0, Vs...>(r);
    return r;
  }();
};

template <class Vs, int I>
struct variant_at;
template <class V, class... Vs>
struct variant_at<Variants<V, Vs...>, 0> {
  using type = V;
};
template <class V, class... Vs, int I>
struct variant_at<Variants<V, Vs...>, I> {
  using type = typename variant_at<Variants<Vs...>, I - 1>::type;
};

}  // namespace search

// The search's answer: `run` (a Train<...>), `choice` (its candidate) and
// `result` (every plan made). Nothing fitting is a compile error naming the
// budget and the smallest peak planned.
template <TrainingRun Run, std::int64_t Budget, class Vs, SearchOptions O = SearchOptions{}>
struct fit_budget {
  static constexpr SearchResult result = search::searched<Run, Budget, Vs, O>::result;
  static constexpr Candidate choice = result.choice;
  static constexpr Candidate smallest = result.smallest();
  HEADROOM_REQUIRE(choice.fits,
                   "fit_budget<Run, Budget, Variants>: no run the variants and options allow fits the budget ({}): the smallest "
                   "planned peak is {} (variant {}, {} blocks checkpointed)",
                   diag::gib{Budget}, diag::gib{smallest.peak}, smallest.variant, smallest.remedy == Remedy::none ? 0 : smallest.blocks);
  using run = typename search::candidate_run<Run, typename search::variant_at<Vs, (choice.fits ? choice.variant : 0)>::type,
                                             choice.remedy, choice.blocks, choice.offload>::type;
};

// What the search planned and chose, for people (host, run time).
inline std::string report(const SearchResult& r) {
  std::ostringstream o;
  const auto bytes = [](std::int64_t b) {
    std::ostringstream g;
    g.setf(std::ios::fixed);
    g.precision(2);
    if (b >= (std::int64_t{1} << 30)) g << static_cast<double>(b) / 1073741824.0 << " GiB";
    else g << static_cast<double>(b) / 1048576.0 << " MiB";
    return g.str();
  };
  const auto line = [&](const Candidate& c) {
    o << "  variant " << c.variant << ", ";
    if (c.remedy == Remedy::first_blocks) o << "Apply<Checkpointed<>, FirstBlocks<" << c.blocks << ">>";
    else o << name_of(c.remedy);
    if (c.offload) o << " + OffloadOptimizer";
    o << ": peak " << bytes(c.peak);
    if (c.offload) o << " (offload tier " << bytes(c.offload_peak) << ")";
    o << ", recompute " << static_cast<double>(c.recompute_flops) * 1e-9 << " GFLOP";
    if (c.offload) o << ", moved " << bytes(c.moved_bytes);
    o << ", extra " << c.seconds * 1e3 << " ms/step" << (c.fits ? "  fits" : "  too large") << "\n";
  };
  o << "fit_budget: device budget " << bytes(r.budget);
  if (r.offload_budget > 0) o << ", offload budget " << bytes(r.offload_budget);
  o << "; " << r.plans << " plans\n";
  for (int i = 0; i < r.plans; ++i) line(r.planned[static_cast<std::size_t>(i)]);
  if (r.choice.fits) {
    o << "chosen (the first variant with a run that fits; within it the least extra seconds per step):\n";
    line(r.choice);
  } else {
    o << "nothing fits\n";
  }
  return o.str();
}

}  // namespace headroom
