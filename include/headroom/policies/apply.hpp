#pragma once
// Applying recipes to a model, the way PEFT's target_modules does.
//
//   Apply<Quantized<NF4, LoRA<16>>, On<q_proj, v_proj>>   every q_proj and v_proj
//   Apply<Checkpointed<>, EveryBlock>                     every block
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
#undef HEADROOM_TARGET

template <class... Targets>
struct On {};
struct EveryBlock {};

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
template <class T, class List>
struct in_list;
template <class T, class... Ls>
struct in_list<T, type_list<Ls...>> : std::bool_constant<(std::is_same_v<T, Ls> || ...)> {};

// Slot: a type_list of the target tags that name it.
template <class Slot, class Base, class... Mods>
struct project {
  using type = Base;
};
template <class Slot, class Base, class R, class... Ts, class... Rest>
struct project<Slot, Base, Apply<R, On<Ts...>>, Rest...> {
  static constexpr bool hit = (in_list<Ts, Slot>::value || ...);
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
struct targets_known<AllTags, Apply<R, On<Ts...>>> : std::bool_constant<(in_list<Ts, AllTags>::value && ...)> {};

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
    ((r == nullptr && !in_list<Ts, AllTags>::value ? (void)(r = target_name<Ts>()) : (void)0), ...);
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
template <class Base, class... Mods>
using every_block_t = typename detail::every_block<Base, Mods...>::type;

// True when some Apply puts LoRA adapters in: the model then trains the
// adapters only, and every other parameter is frozen (as PEFT does).
template <class... Mods>
inline constexpr bool uses_adapters = (detail::has_lora<typename Mods::recipe>() || ... || false);

}  // namespace headroom

namespace headroom {
template <class M>
inline constexpr bool is_modifier_v = detail::is_modifier<M>::value;
}  // namespace headroom
