#pragma once
// Applying recipes to a model, the way PEFT's target_modules does.
//
//   Apply<Quantized<NF4, LoRA<16>>, On<q_proj, v_proj>>   every q_proj and v_proj
//   Apply<Checkpointed<>, EveryBlock>                     every block
//   Apply<Checkpointed<>, Blocks<0, 5, 9>>                blocks 0, 5 and 9
//   Apply<Checkpointed<>, EveryKth<4>>                    blocks 0, 4, 8, ...
//   Apply<Checkpointed<>, FirstBlocks<12>>                blocks 0 to 11
//
// A block selector (Blocks, EveryKth, FirstBlocks) picks blocks by their
// index in the model (0 first); the blocks then differ, and the model keeps
// each run of consecutive blocks of one type in one Repeat
// (layers/block_runs.hpp): the plan builds each run's block once.
//
// A recipe is a policy stack ending in a hole (Linear<> or Hole): the model
// fills the hole with what it would have put there (Linear<In, Out, bias> for
// a projection, the block type for EveryBlock). Several Applies compose in
// order: a later recipe wraps what the earlier ones made.
#include "checkpointed.hpp"
#include "frozen.hpp"
#include "lora.hpp"
#include "offloaded.hpp"
#include "quantized.hpp"

namespace headroom {

// ---- targets ------------------------------------------------------------------------
#define HEADROOM_TARGET(tag) \
  struct tag {               \
    static constexpr std::string_view name = #tag; \
  }
HEADROOM_TARGET(q_proj);
HEADROOM_TARGET(k_proj);
HEADROOM_TARGET(v_proj);
HEADROOM_TARGET(o_proj);
HEADROOM_TARGET(gate_proj);
HEADROOM_TARGET(up_proj);
HEADROOM_TARGET(down_proj);
HEADROOM_TARGET(c_attn);       // GPT-2 fused q|k|v
HEADROOM_TARGET(c_proj);       // GPT-2: both attn.c_proj and mlp.c_proj (PEFT matches by name)
HEADROOM_TARGET(attn_c_proj);  // GPT-2: attn.c_proj only
HEADROOM_TARGET(c_fc);         // GPT-2 MLP up projection
HEADROOM_TARGET(mlp_c_proj);   // GPT-2: mlp.c_proj only
HEADROOM_TARGET(mlp_act);      // the MLP's activation (Llama's silu(gate) * up, GPT-2's GELU): Checkpointed<> only
#undef HEADROOM_TARGET

// What a model puts in the mlp_act slot: nothing but a marker. Apply<Checkpointed<>,
// On<mlp_act>> makes it Checkpointed<ActivationSlot>: the MLP then keeps the
// activation's inputs and recomputes its output before the down projection's
// backward (Korthikanti et al. 2022's selective recomputation, for the MLP).
struct ActivationSlot {
  static constexpr std::string_view kind = "activation";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  using children = type_list<>;
};

template <class... Targets>
struct On {};
struct EveryBlock {};

// ---- block selectors --------------------------------------------------------------------
template <int... I>
struct Blocks {
  static constexpr bool selects(int i, int /*n*/) { return ((i == I) || ...); }
  static constexpr bool valid(int n) { return ((I >= 0 && I < n) && ...); }
  static constexpr int first_invalid(int n) {
    int bad = -1;
    ((bad < 0 && !(I >= 0 && I < n) ? (void)(bad = I) : (void)0), ...);
    return bad;
  }
};
template <int K>
struct EveryKth {
  static_assert(K >= 1, "EveryKth<K>: K must be at least 1 (EveryKth<1> is every block)");
  static constexpr bool selects(int i, int /*n*/) { return i % K == 0; }
  static constexpr bool valid(int /*n*/) { return true; }
  static constexpr int first_invalid(int /*n*/) { return -1; }
};
template <int N>
struct FirstBlocks {
  static_assert(N >= 0, "FirstBlocks<N>: N must not be negative");
  static constexpr bool selects(int i, int /*n*/) { return i < N; }
  static constexpr bool valid(int n) { return N <= n; }
  static constexpr int first_invalid(int n) { return N <= n ? -1 : N; }
};
template <class W>
struct is_block_selector : std::false_type {};
template <int... I>
struct is_block_selector<Blocks<I...>> : std::true_type {};
template <int K>
struct is_block_selector<EveryKth<K>> : std::true_type {};
template <int N>
struct is_block_selector<FirstBlocks<N>> : std::true_type {};

template <class Recipe, class Where>
struct Apply {
  using recipe = Recipe;
  using where = Where;
};

// ---- filling a recipe's hole -----------------------------------------------------------------
namespace detail {
template <class R, class Base>
struct fill {
  using type = R;  // a concrete layer stays as written
};
template <class Base>
struct fill<Hole, Base> {
  using type = Base;
};
template <bool B, class Base>
struct fill<Linear<0, 0, B>, Base> {
  using type = Base;
};
template <class R, class Base>
  requires requires { typename R::inner; typename R::template rebind<Hole>; } && (is_recipe<R>())
struct fill<R, Base> {
  using type = typename R::template rebind<typename fill<typename R::inner, Base>::type>;
};
}  // namespace detail

template <class Recipe, class Base>
using fill_t = typename detail::fill<Recipe, Base>::type;

// ---- resolving a slot ---------------------------------------------------------------------------
namespace detail {
// Slot: a type_list of the target tags that name it.
template <class Slot, class Base, class... Mods>
struct project {
  using type = Base;
};
template <class Slot, class Base, class R, class... Ts, class... Rest>
struct project<Slot, Base, Apply<R, On<Ts...>>, Rest...> {
  static constexpr bool hit = (list_has<Slot, Ts> || ...);
  using type = typename project<Slot, std::conditional_t<hit, fill_t<R, Base>, Base>, Rest...>::type;
};
template <class Slot, class Base, class M, class... Rest>
struct project<Slot, Base, M, Rest...> {
  using type = typename project<Slot, Base, Rest...>::type;
};

template <class Base, class... Mods>
struct every_block {
  using type = Base;
};
template <class Base, class R, class... Rest>
struct every_block<Base, Apply<R, EveryBlock>, Rest...> {
  using type = typename every_block<fill_t<R, Base>, Rest...>::type;
};
template <class Base, class M, class... Rest>
struct every_block<Base, M, Rest...> {
  using type = typename every_block<Base, Rest...>::type;
};

// Block I of N: the EveryBlock recipes, and those whose selector picks I, in order.
template <class Base, int I, int N, class... Mods>
struct block_at {
  using type = Base;
};
template <class Base, int I, int N, class R, class W, class... Rest>
struct block_at<Base, I, N, Apply<R, W>, Rest...> {
  static constexpr bool hit = [] {
    if constexpr (std::is_same_v<W, EveryBlock>) return true;
    else if constexpr (is_block_selector<W>::value) return W::selects(I, N);
    else return false;
  }();
  using type = typename block_at<std::conditional_t<hit, fill_t<R, Base>, Base>, I, N, Rest...>::type;
};

// The first selector of the Applys that names a block the model does not have
// (n blocks): that block's index, or -1.
template <class M>
constexpr int selected_out_of_range(int n) {
  if constexpr (requires { typename M::where; } && is_block_selector<typename M::where>::value) return M::where::first_invalid(n);
  else return -1;
}
template <class... Mods>
constexpr int block_out_of_range([[maybe_unused]] int n) {  // unused when Mods is empty
  int bad = -1;
  ((bad < 0 ? (void)(bad = selected_out_of_range<Mods>(n)) : (void)0), ...);
  return bad;
}

template <class L>
constexpr bool has_lora() {
  if constexpr (requires { L::rank; typename L::alpha; }) return true;
  else if constexpr (requires { typename L::inner; }) return has_lora<typename L::inner>();
  else return false;
}

// Every target of every On<...> must be one of the model's slot tags.
template <class AllTags, class M>
struct targets_known : std::true_type {};
template <class AllTags, class R, class... Ts>
struct targets_known<AllTags, Apply<R, On<Ts...>>> : std::bool_constant<(list_has<AllTags, Ts> && ...)> {};

// For messages: &T::name of the first target of the Applys that is not one
// of AllTags (null if all are known).
inline constexpr std::string_view unnamed_target = "a target without a name";
template <class T>
constexpr const std::string_view* target_name() {
  if constexpr (requires { T::name; }) return &T::name;
  else return &unnamed_target;
}
template <class AllTags, class M>
struct first_unknown_target {
  static constexpr const std::string_view* value = nullptr;
};
template <class AllTags, class R, class... Ts>
struct first_unknown_target<AllTags, Apply<R, On<Ts...>>> {
  static constexpr const std::string_view* value = [] {
    const std::string_view* r = nullptr;
    ((r == nullptr && !list_has<AllTags, Ts> ? (void)(r = target_name<Ts>()) : (void)0), ...);
    return r;
  }();
};
template <class AllTags, class... Mods>
constexpr const std::string_view* unknown_target() {
  const std::string_view* r = nullptr;
  ((r == nullptr ? (void)(r = first_unknown_target<AllTags, Mods>::value) : (void)0), ...);
  return r;
}

template <class M>
struct is_modifier : std::false_type {};
template <class R, class W>
struct is_modifier<Apply<R, W>> : std::true_type {};
}  // namespace detail

template <class Slot, class Base, class... Mods>
using project_t = typename detail::project<Slot, Base, Mods...>::type;

namespace detail {
// For messages: the name of a slot, its last (most specific) target tag:
// GPT-2's type_list<c_proj, attn_c_proj> is attn_c_proj.
template <class Slots>
struct slot_name;
template <class... Ts>
struct slot_name<type_list<Ts...>> {
  static constexpr const std::string_view* value = [] {
    const std::string_view* r = nullptr;
    ((r = target_name<Ts>()), ...);
    return r;
  }();
};
// The block of the quantization format a policy stack stores its weight in
// (0: none, or one block per row).
template <class L>
constexpr std::int64_t quant_block() {
  using Q = typename quant_format_of<L>::type;
  if constexpr (std::is_void_v<Q>) return 0;
  else return Q::desc.block;
}
}  // namespace detail

// A model's projection in slot Slots (a type_list of its target tags), Base
// as the Applys leave it: project_t, and a quantization format an Apply puts
// on it must fit its rows, which the message names by the slot (Quantized
// itself only knows the dims).
template <class Slots, class Base, class... Mods>
struct projection {
  using type = project_t<Slots, Base, Mods...>;
  static constexpr std::int64_t block = detail::quant_block<type>();
  HEADROOM_REQUIRE(block == 0 || Base::in_features % (block == 0 ? 1 : block) == 0,  // (nvcc warns of "% 0" otherwise)
                   "Quantized<{}> on {}: the quantization block size ({}) must divide the row length (in_features) of {} ({})",
                   detail::quant_name<typename quant_format_of<type>::type>(), detail::slot_name<Slots>::value, block,
                   detail::slot_name<Slots>::value, Base::in_features);
};
template <class Slots, class Base, class... Mods>
using projection_t = typename projection<Slots, Base, Mods...>::type;
template <class Base, class... Mods>
using every_block_t = typename detail::every_block<Base, Mods...>::type;
// Block I of a model of N blocks (selectors included).
template <class Base, int I, int N, class... Mods>
using block_at_t = typename detail::block_at<Base, I, N, Mods...>::type;
// Whether some Apply picks blocks (the model's blocks may then differ).
template <class... Mods>
inline constexpr bool selects_blocks = (is_block_selector<typename Mods::where>::value || ... || false);

// The mlp_act slot as the Applys leave it: ActivationSlot, or (the one
// recipe it takes) Checkpointed<ActivationSlot>.
template <class... Mods>
using activation_policy_t = project_t<type_list<mlp_act>, ActivationSlot, Mods...>;
template <class... Mods>
inline constexpr bool recomputes_activation = std::is_same_v<activation_policy_t<Mods...>, Checkpointed<ActivationSlot>>;
template <class... Mods>
inline constexpr bool activation_policy_known =
    std::is_same_v<activation_policy_t<Mods...>, ActivationSlot> || recomputes_activation<Mods...>;

// True when some Apply puts LoRA adapters in: the model then trains the
// adapters only, and every other parameter is frozen (as PEFT does).
template <class... Mods>
inline constexpr bool uses_adapters = (detail::has_lora<typename Mods::recipe>() || ... || false);

}  // namespace headroom

namespace headroom {
template <class M>
inline constexpr bool is_modifier_v = detail::is_modifier<M>::value;
}  // namespace headroom
