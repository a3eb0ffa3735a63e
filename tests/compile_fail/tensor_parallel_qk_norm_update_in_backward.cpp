// Qwen3's per-head q / k norms under tensor parallelism: each rank holds the
// whole gains but only its share of the heads, so each gain's gradient is
// partial and summed after the backward; no update inside the backward.
// expect-gcc: Train<Model, TensorParallel<2>>: UpdateInBackward updates each parameter inside its backward, but each of the 2 ranks holds a partial gradient of the q_norm / k_norm gains
// expect-clang: ranks holds a partial gradient of the q_norm / k_norm gains (from its share of the heads)
#include <headroom/headroom.hpp>
using namespace headroom;

constexpr models::LlamaConfig tiny_qwen3{.vocab = 256, .dim = 128, .ffn = 256, .layers = 2, .heads = 4, .kv_heads = 2,
                                         .max_positions = 64, .arch = models::LlamaArch::qwen3, .head_dim = 48,
                                         .qk_norm = true};
using R = Train<models::Llama<tiny_qwen3>, Batch<1>, Seq<64>, UpdateInBackward, TensorParallel<2>>;
constexpr auto p = plan<R>();
