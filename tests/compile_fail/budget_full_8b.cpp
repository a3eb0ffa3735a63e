// The budget assertion a user writes, failing: full fine-tuning of Llama-3-8B
// (BF16, AdamW) needs ~120 GiB (16 B per parameter before any activation).
// expect: full fine-tuning of Llama-3-8B does not fit 24 GiB
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::llama3_8b>, Batch<1>, Seq<2048>, Precision<BF16>, AdamW>;
constexpr auto p = plan<R>();
static_assert(p.peak_bytes() <= 24_GiB, "full fine-tuning of Llama-3-8B does not fit 24 GiB");
