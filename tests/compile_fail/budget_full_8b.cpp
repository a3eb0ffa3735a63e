// The budget assertion a user writes, failing: full fine-tuning of Llama-3-8B
// (BF16, AdamW) needs ~120 GiB (16 B per parameter before any activation).
// expect-gcc: fits<Run, Budget>: the planned peak (119.68 GiB) exceeds the budget (24.00 GiB)
// expect-clang: headroom::diag::values<128502210816L, 25769803776L>::hold<false>
// expect-clang: fits<Run, Budget>: the planned peak ({}) exceeds the budget ({})
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::llama3_8b>, Batch<1>, Seq<2048>, Precision<BF16>, AdamW>;
static_assert(fits<R, 24_GiB>);
