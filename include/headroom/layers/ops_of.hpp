#pragma once
// ops_of<Model>: every op type the model's layers emit, each with the first
// layer (depth first, in `children` order) that lists it.
//
//   using Ops = ops_of<models::GPT2<models::gpt2_124m>>;   // type_list<op_entry<Embedding<...>, ops::Embedding>, ...>
//
// A layer lists the ops it emits itself in `using ops = type_list<...>`
// (optional: a pure composite emits none of its own); its children list
// theirs. The engines instantiate the kernels of exactly these types, and
// check at compile time that every op the plan runs is among them.
#include <string_view>
#include <type_traits>

#include "../ops/op.hpp"
#include "layer.hpp"

namespace headroom {

template <class L, class O>
struct op_entry {
  using layer = L;
  using op = O;
};

namespace detail {

template <class... Ls>
struct concat;
template <>
struct concat<> {
  using type = type_list<>;
};
template <class... A>
struct concat<type_list<A...>> {
  using type = type_list<A...>;
};
template <class... A, class... B, class... Rest>
struct concat<type_list<A...>, type_list<B...>, Rest...> {
  using type = typename concat<type_list<A..., B...>, Rest...>::type;
};

template <class L>
struct own_ops {
  using type = type_list<>;
};
template <class L>
  requires requires { typename L::ops; }
struct own_ops<L> {
  using type = typename L::ops;
};

template <class L, class Ops>
struct entries_of;
template <class L, class... Os>
struct entries_of<L, type_list<Os...>> {
  using type = type_list<op_entry<L, Os>...>;
};

template <class L>
struct all_op_entries;
template <class Children>
struct children_entries;
template <class... Cs>
struct children_entries<type_list<Cs...>> {
  using type = typename concat<typename all_op_entries<Cs>::type...>::type;
};
template <class L>
struct all_op_entries {
  using type = typename concat<typename entries_of<L, typename own_ops<L>::type>::type,
                               typename children_entries<typename L::children>::type>::type;
};

// Keeps the first entry of each op type.
template <class Done, class Todo>
struct unique_ops;
template <class... Done>
struct unique_ops<type_list<Done...>, type_list<>> {
  using type = type_list<Done...>;
};
template <class... Done, class E, class... Todo>
struct unique_ops<type_list<Done...>, type_list<E, Todo...>> {
  static constexpr bool seen = (std::is_same_v<typename Done::op, typename E::op> || ...);
  using type = typename unique_ops<std::conditional_t<seen, type_list<Done...>, type_list<Done..., E>>, type_list<Todo...>>::type;
};

}  // namespace detail

template <class Model>
using ops_of = typename detail::unique_ops<type_list<>, typename detail::all_op_entries<Model>::type>::type;

// The position of the op named `name` in an ops_of list; -1 if none.
template <class... Es>
constexpr int op_index(type_list<Es...>, std::string_view name) {
  constexpr std::string_view names[] = {std::string_view(Es::op::name)..., std::string_view{}};
  for (int i = 0; i < static_cast<int>(sizeof...(Es)); ++i)
    if (names[i] == name) return i;
  return -1;
}

// Calls f.template operator()<Entry>() for the entry at position i.
template <class... Es, class F>
void visit_op(type_list<Es...>, int i, F&& f) {
  int k = 0;
  (void)((k++ == i ? (f.template operator()<Es>(), true) : false) || ...);
}

}  // namespace headroom
