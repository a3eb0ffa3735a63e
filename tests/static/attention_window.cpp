// A sliding window in the plan: attention's FLOPs count the (query, key)
// pairs inside the window. By hand, per layer, with B sequences of T
// positions, h heads of hd: causal attention scores and weighs about T^2 / 2
// pairs (forward 2 B h T^2 hd FLOPs, backward 5 B h T^2 hd); a window of W
// drops the (T - W)^2 / 2 pairs where key < query - W + 1, that is
// 2 B h (T - W)^2 hd forward and 5 B h (T - W)^2 hd backward.
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr models::LlamaConfig full{.vocab = 64, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                   .max_positions = 160};
constexpr models::LlamaConfig windowed{.vocab = 64, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                       .max_positions = 160, .sliding_window = 20};
constexpr auto a = plan<Train<models::Llama<full>, Batch<1>, Seq<160>>>();
constexpr auto w = plan<Train<models::Llama<windowed>, Batch<1>, Seq<160>>>();
constexpr int64_t B = 1, T = 160, W = 20, h = 4, hd = 16, layers = 2;
static_assert(a.flops_fwd - w.flops_fwd == layers * 2 * B * h * (T - W) * (T - W) * hd);  // 2,508,800
static_assert(a.flops_bwd - w.flops_bwd == layers * 5 * B * h * (T - W) * (T - W) * hd);  // 6,272,000
// the window changes no byte of the plan
static_assert(a.peak_bytes() == w.peak_bytes());

}  // namespace
