// A run planned for the CUDA engine (OnCuda): the model's tensors are the
// host plan's, byte for byte; what the kernels need besides them is the CUDA
// engine's (docs/cuda.md, "Planning for the GPU"). Figures derived by hand.
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr models::GPT2Config small{512, 64, 2, 4, 128};  // vocab, D, layers, heads, positions
using Host = Train<models::GPT2<small>, Batch<2>, Seq<64>, Precision<BF16>, LossChunk<32>>;
using Cuda = Train<models::GPT2<small>, Batch<2>, Seq<64>, Precision<BF16>, LossChunk<32>, OnCuda>;
constexpr auto host = plan<Host>();
constexpr auto cuda = plan<Cuda>();
static_assert(Cuda::config().engine == Engine::cuda && Host::config().engine == Engine::host);
static_assert(cuda.valid());

// The model's tensors do not depend on the engine.
static_assert(cuda.bytes(Role::weights) == host.bytes(Role::weights));
static_assert(cuda.bytes(Role::master_weights) == host.bytes(Role::master_weights));
static_assert(cuda.bytes(Role::grads) == host.bytes(Role::grads));
static_assert(cuda.bytes(Role::optimizer_state) == host.bytes(Role::optimizer_state));
static_assert(cuda.bytes(Role::saved_activation) == host.bytes(Role::saved_activation));

template <class P>
constexpr int64_t count(const P& p, std::string_view name, int64_t bytes) {
  int64_t n = 0;
  for (const auto& b : p.buffers) n += b.name == name && b.bytes == bytes ? 1 : 0;
  return n;
}
template <class P>
constexpr int64_t count(const P& p, std::string_view name) {
  int64_t n = 0;
  for (const auto& b : p.buffers) n += b.name == name ? 1 : 0;
  return n;
}

// One cuBLASLt workspace of 32 MiB instead of the host's GEMM panels.
static_assert(count(cuda, "cublaslt workspace", 32 * 1024 * 1024) == 1 && count(cuda, "gemm panels") == 0);
// The gradient-norm partials and the update's control block: (2048 + 16) f32 = 8,256 B.
static_assert(count(cuda, "reductions", 8256) == 1 && count(host, "reductions") == 0);
// Pinned host staging (the offload tier): 128 tokens and 128 targets (4 B
// each) and 2 x 16 floats of step inputs and results = 1,152 B.
static_assert(count(cuda, "host staging", 1152) == 1 && cuda.peak_bytes(Tier::offload) == 1280);
static_assert(host.peak_bytes(Tier::offload) == 0);
// LM head: one chunk of bf16 logits, 32 x 512 x 2 = 32,768 B, plus the loss of
// each of the 128 tokens in f32 (512 B).
static_assert(count(cuda, "scratch", 32 * 512 * 2 + 128 * 4) == 1);
// With TensorParallel<2> a rank's LM head holds 256 of the 512 rows: its
// logits, 32 x 256 x 2 = 16,384 B, the 128 losses, and then each row's max,
// sum of exponentials and target logit from both ranks, (2, 32, 3) f32 = 768 B.
using CudaTp = Train<models::GPT2<small>, Batch<2>, Seq<64>, Precision<BF16>, LossChunk<32>, OnCuda, TensorParallel<2>>;
static_assert(count(plan<CudaTp>(), "scratch", 32 * 256 * 2 + 128 * 4 + 2 * 32 * 3 * 4) == 1);
// The logits' rows are padded to a multiple of 64 elements, so that cuBLASLt
// writes them with an aligned leading dimension (llm.c pads GPT-2's 50,257 to
// 50,304 for the same reason): 50,257 -> 786 x 64 = 50,304; 385 -> 7 x 64 = 448;
// 512 stays 512.
static_assert(CudaWorkspace::lm_head_logits_ld(50257) == 50304);
static_assert(CudaWorkspace::lm_head_logits_ld(385) == 448);
static_assert(CudaWorkspace::lm_head_logits_ld(512) == 512 && CudaWorkspace::lm_head_logits_ld(64) == 64);
// The losses start 256-byte aligned after the logits: 31 tokens x 448 padded
// columns in bf16 are 27,776 B, rounded up to 27,904 B.
static_assert(CudaWorkspace::lm_head_logits_bytes(31, 385, 2) == 27904);
using OddCuda = Train<models::GPT2<models::GPT2Config{385, 64, 1, 4, 64}>, Batch<1>, Seq<31>, Precision<BF16>, OnCuda>;
using OddHost = Train<models::GPT2<models::GPT2Config{385, 64, 1, 4, 64}>, Batch<1>, Seq<31>, Precision<BF16>>;
static_assert(count(plan<OddCuda>(), "scratch", 27904 + 31 * 4) == 1);
// the host's LM head scratch is unchanged: 31 x (385 + 2) f32 = 47,988 B
static_assert(count(plan<OddHost>(), "scratch", 31 * (385 + 2) * 4) == 1);
// GPT-2 124M at LossChunk<4096> in bf16: 4,096 x 50,304 x 2 = 412,090,368 B of
// logits (already a multiple of 256), where unpadded rows took 411,705,344 B.
static_assert(CudaWorkspace::lm_head_logits_bytes(4096, 50257, 2) == 412090368);
// Attention backward: delta (B, H, T) f32 = 2 x 4 x 64 x 4 = 2,048 B per layer;
// the forward needs no scratch (the host's RoPE table and tiles are gone).
static_assert(count(cuda, "scratch", 2 * 4 * 64 * 4) == 2);
static_assert(count(cuda, "scratch") == 3);

// QLoRA on the GPU: the quantized projections dequantize inside the GEMM (no
// panel scratch), and LoRA's d(A x) is bf16: (N, R) = 128 x 16 x 2 B.
using QLoRA = models::Llama<models::tiny_llama, Apply<Quantized<NF4, LoRA<16>>, On<q_proj, v_proj>>>;
using CudaQ = Train<QLoRA, Batch<2>, Seq<64>, Precision<BF16>, AdamW8bit, OnCuda>;
using HostQ = Train<QLoRA, Batch<2>, Seq<64>, Precision<BF16>, AdamW8bit>;
constexpr auto cq = plan<CudaQ>();
constexpr auto hq = plan<HostQ>();
static_assert(cq.bytes(Role::weights) == hq.bytes(Role::weights) && cq.bytes(Role::quant_scales) == hq.bytes(Role::quant_scales));
static_assert(count(cq, "scratch", 128 * 16 * 2) == 2 * 4);  // q_proj and v_proj of 4 layers
static_assert(cq.peak_bytes(Tier::device) < hq.peak_bytes(Tier::device) + 32 * 1024 * 1024 + 8448);

}  // namespace
