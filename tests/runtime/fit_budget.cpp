// fit_budget against exhaustive search: on a 4-block Llama, every candidate
// of three variants (full AdamW, AdamW8bit, LoRA) is planned here, spelled
// out as its own run type (nothing, On<mlp_act>, FirstBlocks<1..3>,
// EveryBlock, each with and without OffloadOptimizer: 36 plans); for every
// budget at and one byte below each planned peak, the rule (the first
// variant with a fitting run; in it the least recompute FLOPs / rate + bytes
// moved / link) applied to that table must give fit_budget's choice, under
// three sets of options. The chosen run type trains.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <headroom/headroom.hpp>
#include <headroom/plan/fit_budget.hpp>
#include <headroom/train/host/trainer.hpp>
#include <type_traits>
#include <utility>

using namespace headroom;

namespace {

using Lora = Apply<LoRA<8>, On<q_proj, v_proj>>;
template <class... R>
using Tiny = models::Llama<models::tiny_llama, R...>;
using Base = Train<Tiny<>, Batch<4>, Seq<256>>;
using Choices = Variants<Variant<Keep>, Variant<AdamW8bit>, Variant<Keep, Lora>>;

// ---- every candidate, spelled out -------------------------------------------------------------------
template <int Variant, class Remedy, bool Offload>
struct Spelled;
template <class Remedy, bool Offload>
struct Spelled<0, Remedy, Offload> {
  using model = typename Remedy::template model<>;
  using type = std::conditional_t<Offload, Train<model, Batch<4>, Seq<256>, AdamW, OffloadOptimizer>, Train<model, Batch<4>, Seq<256>, AdamW>>;
};
template <class Remedy, bool Offload>
struct Spelled<1, Remedy, Offload> {
  using model = typename Remedy::template model<>;
  using type =
      std::conditional_t<Offload, Train<model, Batch<4>, Seq<256>, AdamW8bit, OffloadOptimizer>, Train<model, Batch<4>, Seq<256>, AdamW8bit>>;
};
template <class Remedy, bool Offload>
struct Spelled<2, Remedy, Offload> {
  using model = typename Remedy::template model<Lora>;
  using type = std::conditional_t<Offload, Train<model, Batch<4>, Seq<256>, AdamW, OffloadOptimizer>, Train<model, Batch<4>, Seq<256>, AdamW>>;
};
struct Nothing {
  static constexpr Remedy kind = Remedy::none;
  static constexpr int blocks = 0;
  template <class... Pre>
  using model = Tiny<Pre...>;
};
struct Act {
  static constexpr Remedy kind = Remedy::mlp_act;
  static constexpr int blocks = 0;
  template <class... Pre>
  using model = Tiny<Pre..., Apply<Checkpointed<>, On<mlp_act>>>;
};
template <int K>
struct First {
  static constexpr Remedy kind = Remedy::first_blocks;
  static constexpr int blocks = K;
  template <class... Pre>
  using model = Tiny<Pre..., Apply<Checkpointed<>, FirstBlocks<K>>>;
};
struct Every {
  static constexpr Remedy kind = Remedy::every_block;
  static constexpr int blocks = 4;
  template <class... Pre>
  using model = Tiny<Pre..., Apply<Checkpointed<>, EveryBlock>>;
};

struct Entry {
  int variant = 0;
  Remedy remedy = Remedy::none;
  int blocks = 0;
  bool offload = false;
  std::int64_t peak = 0, offload_peak = 0, recompute = 0, moved = 0;
};
template <int V, class R, bool Off>
constexpr Entry entry() {
  using Run = typename Spelled<V, R, Off>::type;
  const auto p = plan<Run>();
  return Entry{V, R::kind, R::blocks, Off, p.peak_bytes(), p.peak_bytes(Tier::offload), p.flops_recompute,
               Off ? 2 * p.trainable_parameters() * 4 : 0};  // gradients out, weights back, f32
}
// in enumeration order: variant, then without / with offloading, then nothing, act, 1, 2, 3 blocks, every block
template <int V, bool Off>
constexpr std::array<Entry, 6> row() {
  return {entry<V, Nothing, Off>(), entry<V, Act, Off>(), entry<V, First<1>, Off>(), entry<V, First<2>, Off>(),
          entry<V, First<3>, Off>(), entry<V, Every, Off>()};
}
constexpr std::array<Entry, 36> table = [] {
  std::array<Entry, 36> t{};
  const std::array<std::array<Entry, 6>, 6> rows{row<0, false>(), row<0, true>(), row<1, false>(),
                                                 row<1, true>(), row<2, false>(), row<2, true>()};
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t i = 0; i < 6; ++i) t[r * 6 + i] = rows[r][i];
  return t;
}();

// The rule, applied to the whole table.
constexpr double seconds(const Entry& e, const SearchOptions& o) {
  return static_cast<double>(e.recompute) / static_cast<double>(o.flops_per_second) +
         static_cast<double>(e.moved) / static_cast<double>(o.link_bytes_per_second);
}
constexpr bool allowed(const Entry& e, const SearchOptions& o) {
  if (e.offload && !o.offload_optimizer) return false;
  if (e.remedy == Remedy::mlp_act && !o.recompute_activation) return false;
  if ((e.remedy == Remedy::first_blocks || e.remedy == Remedy::every_block) && !o.checkpoint_blocks) return false;
  return true;
}
constexpr int expected(std::int64_t budget, const SearchOptions& o) {  // index into table, -1: nothing fits
  for (int v = 0; v < 3; ++v) {
    int best = -1;
    for (int i = 0; i < 36; ++i) {
      const Entry& e = table[static_cast<std::size_t>(i)];
      if (e.variant != v || !allowed(e, o) || e.peak > budget || (e.offload && e.offload_peak > o.offload_budget)) continue;
      if (best < 0 || seconds(e, o) < seconds(table[static_cast<std::size_t>(best)], o)) best = i;
    }
    if (best >= 0) return best;
  }
  return -1;
}

// Every budget at which the answer may change: each peak, and one byte below
// it, where something still fits.
template <SearchOptions O>
constexpr auto budgets = [] {
  std::array<std::int64_t, 72> b{};
  std::size_t n = 0;
  for (const Entry& e : table)
    for (const std::int64_t x : {e.peak, e.peak - 1})
      if (expected(x, O) >= 0) {
        bool seen = false;
        for (std::size_t i = 0; i < n; ++i) seen = seen || b[i] == x;
        if (!seen) b[n++] = x;
      }
  return std::pair{b, n};
}();

struct Checked {
  int budgets = 0, agree = 0, plans_max = 0;
};
template <SearchOptions O, std::int64_t B>
void check_one(Checked& c) {
  using F = fit_budget<Base, B, Choices, O>;
  const int want = expected(B, O);
  const Entry& e = table[static_cast<std::size_t>(want)];
  INFO("budget " << B << " B: exhaustive says variant " << e.variant << ", " << name_of(e.remedy) << " " << e.blocks
                 << (e.offload ? " + offload" : "") << "; the search " << F::choice.variant << ", " << name_of(F::choice.remedy)
                 << " " << F::choice.blocks << (F::choice.offload ? " + offload" : "") << "\n"
                 << report(F::result));
  const bool same = F::choice.variant == e.variant && F::choice.remedy == e.remedy && F::choice.offload == e.offload &&
                    (e.remedy != Remedy::first_blocks || F::choice.blocks == e.blocks);
  CHECK(same);
  CHECK(F::choice.peak == e.peak);
  CHECK(F::choice.peak <= B);
  CHECK(plan<typename F::run>().peak_bytes() == F::choice.peak);  // the run type is the one planned
  ++c.budgets;
  c.agree += same;
  c.plans_max = std::max(c.plans_max, F::result.plans);
}
template <SearchOptions O, std::size_t... I>
Checked check_all(std::index_sequence<I...>) {
  Checked c;
  (check_one<O, budgets<O>.first[I]>(c), ...);
  return c;
}
template <SearchOptions O>
Checked check() {
  return check_all<O>(std::make_index_sequence<budgets<O>.second>{});
}

}  // namespace

TEST_CASE("fit_budget: the spelled-out candidates are the search's run types", "[plan][fit_budget]") {
  using search::candidate_run;
  STATIC_REQUIRE(std::is_same_v<candidate_run<Base, Variant<Keep>, Remedy::none, 0, false>::type, Spelled<0, Nothing, false>::type>);
  STATIC_REQUIRE(std::is_same_v<candidate_run<Base, Variant<AdamW8bit>, Remedy::first_blocks, 2, true>::type, Spelled<1, First<2>, true>::type>);
  STATIC_REQUIRE(std::is_same_v<candidate_run<Base, Variant<Keep, Lora>, Remedy::mlp_act, 0, false>::type, Spelled<2, Act, false>::type>);
  STATIC_REQUIRE(std::is_same_v<candidate_run<Base, Variant<Keep, Lora>, Remedy::every_block, 4, true>::type, Spelled<2, Every, true>::type>);
  // the table's shape: checkpointing more blocks never raises the peak; each variant needs less than the one before
  for (std::size_t r = 0; r < 6; ++r) {
    for (std::size_t i = 2; i < 6; ++i) CHECK(table[r * 6 + i].peak <= table[r * 6 + i - 1].peak);
    CHECK(table[r * 6 + 5].peak < table[r * 6].peak);
  }
  CHECK(table[12].peak < table[0].peak);  // AdamW8bit
  CHECK(table[24].peak < table[12].peak);  // LoRA
  CHECK(table[6].peak < table[0].peak);   // OffloadOptimizer moves states off the device
}

TEST_CASE("fit_budget agrees with exhaustive search at every budget where the answer changes", "[plan][fit_budget]") {
  constexpr SearchOptions plain{};
  constexpr SearchOptions offload{.offload_optimizer = true, .offload_budget = std::int64_t{1} << 30};
  constexpr SearchOptions blocks_only{.recompute_activation = false, .offload_optimizer = true, .offload_budget = 400'000'000};
  for (const auto& [name, c] : {std::pair{"defaults", check<plain>()}, std::pair{"offload", check<offload>()},
                                 std::pair{"blocks only, tight offload tier", check<blocks_only>()}}) {
    INFO(name << ": " << c.budgets << " budgets, " << c.agree << " agree, at most " << c.plans_max << " plans of 36");
    CHECK(c.budgets >= 10);
    CHECK(c.agree == c.budgets);
    CHECK(c.plans_max < 36);
  }
}

TEST_CASE("fit_budget's run trains", "[plan][fit_budget]") {
  // one byte below full fine-tuning's smallest peak (every block checkpointed): AdamW8bit's turn
  constexpr std::int64_t budget = table[5].peak - 1;
  STATIC_REQUIRE(table[17].peak <= budget);
  using F = fit_budget<Base, budget, Choices>;
  STATIC_REQUIRE(F::choice.variant == 1);
  using R = F::run;
  host::Trainer<Train<typename R::model, Batch<1>, Seq<32>, typename R::optimizer>> t({.seed = 1, .lr = 1e-3});
  std::vector<std::int32_t> tok(32), tgt(32);
  for (int i = 0; i < 32; ++i) tok[i] = i % 50, tgt[i] = (i * 7 + 3) % 50;
  const double first = t.step(tok, tgt).loss;
  double last = first;
  for (int s = 0; s < 5; ++s) last = t.step(tok, tgt).loss;
  CHECK(last < first);
  INFO(report(F::result));
  CHECK(F::result.plans >= 3);
}
