// The budget of a plan already computed: fits_budget<peak, budget>.
// expect-gcc: fits<Run, Budget>: the planned peak (0.11 GiB) exceeds the budget (0.06 GiB)
// expect-clang: headroom::diag::values<117039872, 67108864>::hold<false>
// expect-clang: fits<Run, Budget>: the planned peak ({}) exceeds the budget ({})
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<4>, Seq<256>>;
constexpr auto p = plan<R>();
static_assert(fits_budget<p.peak_bytes(), 64_MiB>);
