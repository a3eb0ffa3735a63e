#pragma once
// A system header for the compilers: an error in the expansion of
// HEADROOM_REQUIRE is then reported at the line that wrote the requirement,
// not at this header's macro (g++; the "required from here" line above it
// is the user's).
#pragma GCC system_header
// Compile-time messages that carry numbers (docs/compile-time-errors.md).
//
//   HEADROOM_REQUIRE(cond, "sentence with {} placeholders", values...);
//
//   HEADROOM_REQUIRE(In % Block == 0,
//                    "MyLayer<In, Block>: the block size ({}) must divide In ({})", Block, In);
//
// A static_assert whose first error line holds the sentence and the values:
//
//   g++    the sentence with each {} replaced by the next value, formatted
//          at compile time into a char array that the compiler prints:
//            error: invalid application of 'sizeof' to incomplete type
//            'headroom::compile_error<headroom::diag::text<63>{"MyLayer<In,
//            Block>: the block size (64) must divide In (96)"}>'
//   clang  a static_assert over the values (clang prints a failed
//          requirement with its template arguments substituted), then the
//          sentence with its {} placeholders, which the values fill in order:
//            error: static_assert failed due to requirement
//            '::headroom::diag::values<64, 96>::hold<false>' "MyLayer<In,
//            Block>: the block size ({}) must divide In ({})"
//   other  (nvcc, nvc++, icc, MSVC) a plain static_assert(cond, sentence).
//
// The formatting runs only when the condition is false, so a check that
// holds costs one function template instantiation (message_if<true, ...>,
// an empty text). Values are integers, bool,
// enums (as their number), diag::gib{bytes} (g++: "24.00 GiB", two
// decimals; clang: bytes) and pointers to a static std::string_view
// (diag::name<T> is &T::name; g++ prints the text, clang '&T::name').
//
// Rules: write it where a static_assert may stand (class body, namespace
// scope, function body); the condition and each value must not contain an
// unparenthesized comma (name a constant instead); the sentence is a string
// literal without quotes or apostrophes (g++ prints them escaped, as \').
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace headroom {
namespace diag {

// A string as a template argument (a structural type: one public char array).
template <std::size_t N>
struct text {
  char s[N]{};
  constexpr text() = default;
  constexpr text(const char (&a)[N]) {
    for (std::size_t i = 0; i < N; ++i) s[i] = a[i];
  }
};

// Bytes to be shown in GiB with two decimals (g++) or in bytes (clang).
struct gib {
  std::int64_t bytes;
};

// &T::name: a model's or a target tag's name, as a template argument.
template <class T>
inline constexpr const std::string_view* name = &T::name;

// clang: the values are the template arguments of the failed requirement.
template <auto... V>
struct values {
  template <bool Ok>
  static constexpr bool hold = Ok;
};
// Integers that fit an int are passed as int (clang prints 64, not 64L);
// gib as its bytes.
template <auto V>
constexpr auto shown() {
  using T = std::remove_cvref_t<decltype(V)>;
  if constexpr (std::is_same_v<T, gib>) return shown<V.bytes>();
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) > sizeof(int)) {
    if constexpr (V >= -2147483647 - 1 && V <= 2147483647) return static_cast<int>(V);
    else return V;
  } else return V;
}
template <auto... V>
using values_of = values<shown<V>()...>;

}  // namespace diag
}  // namespace headroom

#if defined(__CUDACC__) || defined(__NVCOMPILER) || defined(__INTEL_COMPILER) || (!defined(__GNUC__) && !defined(__clang__))
#define HEADROOM_DIAG_PLAIN 1
#elif defined(__clang__)
#define HEADROOM_DIAG_CLANG 1
#else
#define HEADROOM_DIAG_GCC 1
#endif

#if defined(HEADROOM_DIAG_GCC)
namespace headroom {
namespace diag {
// ---- formatting (g++) ------------------------------------------------------------------
// Counts characters when out is null, writes them otherwise.
struct sink {
  char* out = nullptr;
  std::size_t n = 0;
  constexpr void put(char c) {
    if (out) out[n] = c;
    ++n;
  }
  constexpr void put(std::string_view v) {
    for (char c : v) put(c);
  }
  constexpr void put_unsigned(std::uint64_t v, int min_digits = 1) {
    char d[20]{};
    int k = 0;
    do {
      d[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0 || k < min_digits);
    while (k > 0) put(d[--k]);
  }
};

template <class T>
constexpr void put_value(sink& s, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    s.put(v ? std::string_view("true") : std::string_view("false"));
  } else if constexpr (std::is_same_v<T, char>) {
    s.put(v);
  } else if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) {
      if (v < 0) {
        s.put('-');
        s.put_unsigned(static_cast<std::uint64_t>(0) - static_cast<std::uint64_t>(v));
        return;
      }
    }
    s.put_unsigned(static_cast<std::uint64_t>(v));
  } else if constexpr (std::is_enum_v<T>) {
    put_value(s, static_cast<std::underlying_type_t<T>>(v));
  } else if constexpr (std::is_same_v<T, gib>) {
    // hundredths of a GiB, rounded half up
    const auto b = static_cast<std::uint64_t>(v.bytes < 0 ? -v.bytes : v.bytes);
    const std::uint64_t whole = b >> 30, rest = b & ((std::uint64_t{1} << 30) - 1);
    std::uint64_t centi = (rest * 100 + (std::uint64_t{1} << 29)) >> 30;
    if (v.bytes < 0) s.put('-');
    s.put_unsigned(whole + centi / 100);
    s.put('.');
    s.put_unsigned(centi % 100, 2);
    s.put(std::string_view(" GiB"));
  } else if constexpr (std::is_same_v<T, const std::string_view*>) {
    s.put(*v);
  } else {
    static_assert(std::is_integral_v<T>, "HEADROOM_REQUIRE: a value must be an integer, bool, enum, diag::gib or diag::name<T>");
  }
}

template <text F, auto... V>
constexpr void render(sink& s) {
  constexpr std::size_t len = sizeof(F.s) - 1;
  std::size_t next = 0;
  for (std::size_t i = 0; i < len; ++i) {
    if (F.s[i] == '{' && i + 1 < len && F.s[i + 1] == '}') {
      std::size_t k = 0;
      bool found = false;
      ((k++ == next ? (put_value(s, V), found = true) : false), ...);
      if (!found) s.put(std::string_view("{}"));
      ++next;
      ++i;
    } else {
      s.put(F.s[i]);
    }
  }
}

template <text F, auto... V>
constexpr auto format() {
  constexpr std::size_t n = [] {
    sink s{};
    render<F, V...>(s);
    return s.n;
  }();
  text<n + 1> t{};
  sink s{t.s, 0};
  render<F, V...>(s);
  return t;
}

// The sentence with its values when the requirement fails; an empty text,
// formatted from nothing, when it holds.
template <bool Ok, text F, auto... V>
constexpr auto message_if() {
  if constexpr (Ok) return text<1>{};
  else return format<F, V...>();
}
}  // namespace diag

// Defined for the empty text only: naming the size of compile_error<the
// sentence> is the error that prints the sentence (g++).
template <diag::text Message>
struct compile_error;
template <>
struct compile_error<diag::text<1>{}> {};

}  // namespace headroom
#endif  // HEADROOM_DIAG_GCC

#if defined(HEADROOM_DIAG_PLAIN)
#define HEADROOM_REQUIRE(cond, message, ...) static_assert(static_cast<bool>(cond), message)
#elif defined(HEADROOM_DIAG_CLANG)
#define HEADROOM_REQUIRE(cond, message, ...)                                                                        \
  static_assert(::headroom::diag::values_of<__VA_ARGS__>::template hold<static_cast<bool>(cond)>, message)
#else
#define HEADROOM_REQUIRE(cond, message, ...)                                                                        \
  static_assert(sizeof(::headroom::compile_error<::headroom::diag::message_if<                                       \
                    static_cast<bool>(cond), ::headroom::diag::text{message} __VA_OPT__(, ) __VA_ARGS__>()>) != 0,   \
                message)
#endif
