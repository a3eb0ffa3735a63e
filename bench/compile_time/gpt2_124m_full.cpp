// Compile-time benchmark input: the plan of GPT-2 124M full fine-tuning.
#include <headroom/headroom.hpp>
using namespace headroom;
using BenchRun = Train<models::GPT2<models::gpt2_124m>, Batch<4>, Seq<1024>, AdamW>;
constexpr auto p = plan<BenchRun>();
static_assert(p.valid() && p.peak_bytes() > 0);
int main() { return p.peak_bytes() > 0 ? 0 : 1; }
