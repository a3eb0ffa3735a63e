// HEADROOM_REQUIRE (core/diagnostic.hpp): checks that hold cost nothing and
// say nothing; on g++ the sentence a failing check prints is formatted here.
#include <headroom/headroom.hpp>

#include <string_view>

using namespace headroom;

// Holding checks, at namespace scope, in a class template and in a function.
HEADROOM_REQUIRE(64 % 16 == 0, "16 must divide 64 ({}, {})", 16, 64);

template <std::int64_t In, std::int64_t Block>
struct BlockScale {
  HEADROOM_REQUIRE(In % Block == 0, "BlockScale<In, Block>: the block size ({}) must divide In ({})", Block, In);
  static constexpr std::int64_t blocks = In / Block;
};
static_assert(BlockScale<128, 64>::blocks == 2);

constexpr int checked_in_a_function() {
  HEADROOM_REQUIRE(sizeof(int) >= 2, "int has {} bytes", sizeof(int));
  return 1;
}
static_assert(checked_in_a_function() == 1);

// The budget checks that hold.
using Tiny = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>>;
static_assert(fits<Tiny, 1_GiB>);
static_assert(fits_budget<100, 100>);

#if defined(HEADROOM_DIAG_GCC)
template <std::size_t N>
constexpr std::string_view view(const diag::text<N>& t) {
  return std::string_view(t.s, N - 1);
}
static_assert(view(diag::format<"no placeholders">()) == "no placeholders");
static_assert(view(diag::format<"block {} must divide row {}", 64, std::int64_t{96}>()) == "block 64 must divide row 96");
static_assert(view(diag::format<"{} {} {}", -5, true, std::uint64_t{18446744073709551615u}>()) ==
              "-5 true 18446744073709551615");
static_assert(view(diag::format<"{}", std::int64_t{-9223372036854775807 - 1}>()) == "-9223372036854775808");
static_assert(view(diag::format<"{} and {}", diag::gib{24_GiB}, diag::gib{7307291136}>()) == "24.00 GiB and 6.81 GiB");
static_assert(view(diag::format<"{}", diag::gib{(1_GiB) / 200 + 1}>()) == "0.01 GiB");  // just over 0.005: up
static_assert(view(diag::format<"{}", diag::gib{(1_GiB) * 99 / 100 + 1_MiB * 6}>()) == "1.00 GiB");
static_assert(view(diag::format<"{} of {}", diag::name<q_proj>, diag::name<NF4>>()) == "q_proj of NF4");
static_assert(view(diag::format<"{} {}", 1>()) == "1 {}");  // a placeholder without a value stays
#endif
