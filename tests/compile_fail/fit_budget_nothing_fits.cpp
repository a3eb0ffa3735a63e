// No run the variants and options allow fits the budget.
// expect-gcc: fit_budget<Run, Budget, Variants>: no run the variants and options allow fits the budget (0.01 GiB): the smallest planned peak is
// expect-clang: fit_budget<Run, Budget, Variants>: no run the variants and options allow fits the budget ({}): the smallest planned peak is {}
#include <headroom/headroom.hpp>
#include <headroom/plan/fit_budget.hpp>
using namespace headroom;

using Base = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<256>>;
using Found = fit_budget<Base, 10'000'000, Variants<Variant<Keep>, Variant<AdamW8bit>>>;
constexpr auto c = Found::choice;
