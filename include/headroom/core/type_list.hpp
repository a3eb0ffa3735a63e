#pragma once
// type_list<Ts...>: a list of types, the way layers name their children and
// ops, producers the ops they fuse, and runs their options.
#include <cstddef>
#include <type_traits>

namespace headroom {

template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

// Whether list L holds the type T.
template <class L, class T>
inline constexpr bool list_has = false;
template <class... Ts, class T>
inline constexpr bool list_has<type_list<Ts...>, T> = (std::is_same_v<Ts, T> || ...);

}  // namespace headroom
