#pragma once
// Epilogue fusion, named by type on both sides. A producer lists the ops its
// kernels compute in their epilogue; an op that can be computed there names
// that producer and the input the producer's output feeds:
//
//   struct Linear { using epilogues = type_list<Gelu, SwiGLU>; ... };  // its kernels compute these
//   struct Gelu   { static constexpr ops::EpilogueOf<Linear> epilogue{x}; ... };
//
// The schedule runs an op inside the step right before it only where that
// step's op lists it (and their buffers allow it; plan/schedule.hpp); the
// fused op's own kernel then does not run, its producer's computes it
// (OpContext::fused<Gelu>()). The engines refuse at compile time an op
// that names a producer which does not list it (its forward would run
// nowhere) and a producer that lists an op naming another producer or none.
#include <string_view>
#include <type_traits>

#include "../core/type_list.hpp"
#include "../graph/operands.hpp"

namespace headroom::ops {

// The producer P (possibly still incomplete where this is written) whose
// output feeds input `input` of the op that declares this.
template <class P>
struct EpilogueOf {
  using producer = P;
  int input = 0;
  template <int I>
  constexpr EpilogueOf(In<I>) : input(I) {}
};

namespace detail {
// The op a missing side of a pair stands for in a message.
struct no_op {
  static constexpr std::string_view name = "(none)";
};
template <class O>
struct producer_of {
  using type = no_op;
};
template <class O>
  requires requires { O::epilogue; }
struct producer_of<O> {
  using type = typename std::remove_cvref_t<decltype(O::epilogue)>::producer;
};
template <class P>
struct epilogues_of {
  using type = type_list<>;
};
template <class P>
  requires requires { typename P::epilogues; }
struct epilogues_of<P> {
  using type = typename P::epilogues;
};

// A pair of ops where only one side names the other, or none (found false).
template <class O, class P, bool Found = true>
struct EpiloguePair {
  using op = O;
  using producer = P;
  static constexpr bool found = Found;
};
using no_pair = EpiloguePair<no_op, no_op, false>;

template <class A, class B>
using first_found = std::conditional_t<A::found, A, B>;

// O names a producer that does not list it
template <class O>
using unlisted_pair = std::conditional_t<!std::is_same_v<typename producer_of<O>::type, no_op> &&
                                             !list_has<typename epilogues_of<typename producer_of<O>::type>::type, O>,
                                         EpiloguePair<O, typename producer_of<O>::type>, no_pair>;

// P lists an op that does not name it
template <class P, class List = typename epilogues_of<P>::type>
struct unnamed_pair;
template <class P, class... Es>
struct unnamed_pair<P, type_list<Es...>> {
  using type = no_pair;
};
template <class P, class E, class... Es>
struct unnamed_pair<P, type_list<E, Es...>> {
  using type = std::conditional_t<!std::is_same_v<typename producer_of<E>::type, P>, EpiloguePair<E, P>,
                                  typename unnamed_pair<P, type_list<Es...>>::type>;
};

template <template <class> class Pair, class... Os>
struct first_pair;
template <template <class> class Pair>
struct first_pair<Pair> {
  using type = no_pair;
};
template <template <class> class Pair, class O, class... Os>
struct first_pair<Pair, O, Os...> {
  using type = first_found<Pair<O>, typename first_pair<Pair, Os...>::type>;
};
template <class P>
using unnamed_pair_of = typename unnamed_pair<P>::type;
}  // namespace detail

// Among ops Os: the first op that names a producer which does not list it.
template <class... Os>
using epilogue_not_listed = typename detail::first_pair<detail::unlisted_pair, Os...>::type;
// Among ops Os: the first producer that lists an op which does not name it.
template <class... Os>
using epilogue_not_named = typename detail::first_pair<detail::unnamed_pair_of, Os...>::type;

// The names of the ops P lists in `epilogues`, for the graph.
template <class... Es>
constexpr void epilogue_names(type_list<Es...>, std::string_view* out) {
  std::size_t i = 0;
  ((out[i++] = Es::name), ...);
}

}  // namespace headroom::ops
