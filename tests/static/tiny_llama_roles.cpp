// The memory of one step of tiny_llama, role by role, derived by hand from the
// op list of the layer headers (what each op's backward reads again) and the
// storage formats. tiny_llama: vocab 256, D 256, F 768, 4 layers, 4 heads of
// hd 64, 2 KV heads, untied LM head (models/llama.hpp).
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

constexpr int64_t params = 3'279'104;  // derived in presets.cpp

// ============================================================================
// 1. F32, AdamW, full fine-tuning, Batch 2, Seq 64: N = 128 tokens
// ============================================================================
using Tiny = models::Llama<models::tiny_llama>;
constexpr auto full = plan<Train<Tiny, Batch<2>, Seq<64>, AdamW>>();
static_assert(full.valid());
static_assert(full.lower_bound() <= full.peak_bytes());
static_assert(full.peak_bytes() * 100 <= full.lower_bound() * 105);

// Every parameter tensor's f32 bytes is a multiple of 256 (the smallest, an
// RMSNorm weight, is 256 * 4 = 1,024 B), so no rounding:
static_assert(full.bytes(Role::weights) == 4 * params);           // 13,116,416
static_assert(full.bytes(Role::grads) == 4 * params);
static_assert(full.bytes(Role::optimizer_state) == 8 * params);   // AdamW: m, v in f32
static_assert(full.bytes(Role::master_weights) == 0);             // f32 needs no master copy
static_assert(full.bytes(Role::quant_scales) == 0);
// token ids and targets, i32 (128 * 4 = 512 B each), the f32 loss (4 -> 256)
static_assert(full.bytes(Role::batch_io) == 512 + 512 + 256);

// Saved activations. Sizes at N = 128, f32:
constexpr int64_t xD = 128 * 256 * 4;   // (N, D)        131,072
constexpr int64_t xKV = 128 * 128 * 4;  // (N, KV hd)     65,536
constexpr int64_t xF = 128 * 768 * 4;   // (N, F)        393,216
constexpr int64_t rstd = 128 * 4;       // (N) f32           512
constexpr int64_t lse = 2 * 4 * 64 * 4; // (B, H, T) f32   2,048
// all multiples of 256: no rounding. One block, op by op:
//   input_layernorm(x)      saves x, rstd1            -> x (N,D), rstd
//   q_proj / k_proj / v_proj(h1) save h1 (one tensor)  -> h1 (N,D)
//   attention(q, k, v)      saves q, k, v, o, lse      -> q (N,D), k, v (N,KV hd), o (N,D), lse
//   o_proj(o)               saves o (already counted)
//   residual_1 x2 = x + a   saves nothing
//   post_attention_layernorm(x2) saves x2, rstd2       -> x2 (N,D), rstd
//   gate_proj / up_proj(h2) save h2                     -> h2 (N,D)
//   silu(g) * u             saves g, u                  -> g, u (N,F)
//   down_proj(s)            saves s                     -> s (N,F)
//   residual_2 y = x2 + m   saves nothing (y is the next block's x)
constexpr int64_t block = xD + rstd + xD + (xD + xKV + xKV + xD + lse) + xD + rstd + xD + 3 * xF;
static_assert(block == 2'100'224);
// 4 blocks (x of block 0 is the embedding output; of block j > 0, y of block
// j - 1), then the final norm saves y of block 3 and its rstd. The embedding
// keeps only the token ids (batch io); the fused LM head + loss runs its
// backward inside the loss event, so its input is not a saved activation.
static_assert(full.bytes(Role::saved_activation) == 4 * block + xD + rstd);
static_assert(full.bytes(Role::saved_activation) == 8'532'480);
static_assert(full.bytes(Role::recompute) == 0);
static_assert(full.flops_recompute == 0);

// FLOPs (the cost model of the layer headers): per block, forward
//   norms 2 x 4ND; q, o 2 x 2ND^2; k, v 2 x 2ND(KV hd); attention 2 B H T^2 hd
//   (causal: half of QK^T and PV) + RoPE 3 B T (H + KV) hd; residuals 2 x ND;
//   gate, up, down 3 x 2NDF; SiLU-mul 5NF
constexpr int64_t N = 128, D = 256, F = 768, KVhd = 128;
constexpr int64_t fl_norm = 4 * N * D, fl_res = N * D;
constexpr int64_t fl_qo = 2 * N * D * D, fl_kv = 2 * N * D * KVhd, fl_mlp = 2 * N * D * F;
constexpr int64_t fl_attn = 2 * 2 * 4 * 64 * 64 * 64 + 3 * 2 * 64 * (4 + 2) * 64;
constexpr int64_t fl_block = 2 * fl_norm + 2 * fl_qo + 2 * fl_kv + fl_attn + 2 * fl_res + 3 * fl_mlp + 5 * N * F;
static_assert(fl_block == 206'487'552);
// + the final norm and the LM head (2 N D V); the embedding lookup is free
static_assert(full.flops_fwd == 4 * fl_block + fl_norm + 2 * N * D * 256);

// Lion keeps one f32 momentum per element, half of AdamW's state; the rest
// of the plan is the same run's
constexpr auto lion = plan<Train<Tiny, Batch<2>, Seq<64>, Lion>>();
static_assert(lion.bytes(Role::optimizer_state) == 4 * params);
static_assert(lion.bytes(Role::weights) == full.bytes(Role::weights));
static_assert(lion.bytes(Role::saved_activation) == full.bytes(Role::saved_activation));
static_assert(lion.peak_bytes() + 4 * params == full.peak_bytes());

// ============================================================================
// 2. The same run with checkpointed blocks
// ============================================================================
using TinyCkpt = models::Llama<models::tiny_llama, Apply<Checkpointed<>, EveryBlock>>;
constexpr auto ckpt = plan<Train<TinyCkpt, Batch<2>, Seq<64>, AdamW>>();
static_assert(ckpt.valid());
static_assert(ckpt.peak_bytes() * 100 <= ckpt.lower_bound() * 105);
static_assert(ckpt.bytes(Role::weights) == 4 * params);
static_assert(ckpt.bytes(Role::grads) == 4 * params);
// Only the block inputs are kept (x_emb, y0, y1, y2), plus what the layers
// after the blocks save (the final norm: y3 and its rstd).
static_assert(ckpt.bytes(Role::saved_activation) == 4 * xD + xD + rstd);
static_assert(ckpt.bytes(Role::saved_activation) == 655'872);
// Backward of each block first recomputes what the block's backward reads:
// h1, rstd1, q, k, v, o, lse, o_proj's output a (the residual needs it to
// recompute x2), x2, rstd2, h2, g, u, s, for each of the 4 instances.
static_assert(ckpt.bytes(Role::recompute) == 4 * (xD + rstd + xD + xKV + xKV + xD + lse + xD + xD + rstd + xD + 3 * xF));
static_assert(ckpt.bytes(Role::recompute) == 8'400'896);
// Recompute FLOPs: the block's forward, except its tail whose outputs no
// backward reads: down_proj's output m feeds only residual_2, whose output
// belongs to the next block. (Classical checkpointing re-runs the whole
// forward; here down_proj's GEMM and residual_2 are not repeated.)
static_assert(ckpt.flops_recompute == 4 * (fl_block - fl_mlp - fl_res));
static_assert(ckpt.flops_recompute < 4 * fl_block);
static_assert(ckpt.flops_fwd == full.flops_fwd);
static_assert(ckpt.flops_bwd == full.flops_bwd);

// ============================================================================
// 2b. Selected blocks checkpointed (Blocks, EveryKth, FirstBlocks)
// ============================================================================
// Blocks 0 and 2 checkpointed, 1 and 3 not: four runs of one block each
// (layers/block_runs.hpp). A checkpointed block keeps its input only; a plain
// one keeps `block` (its own input included), whatever its neighbours do.
using TinySel = models::Llama<models::tiny_llama, Apply<Checkpointed<>, Blocks<0, 2>>>;
static_assert(TinySel::blocks::run_count == 4);
constexpr auto sel = plan<Train<TinySel, Batch<2>, Seq<64>, AdamW>>();
static_assert(sel.valid());
static_assert(sel.bytes(Role::saved_activation) == 2 * xD + 2 * block + xD + rstd);
static_assert(sel.bytes(Role::saved_activation) == 4'594'176);
static_assert(sel.bytes(Role::recompute) == ckpt.bytes(Role::recompute) / 2);
static_assert(sel.flops_recompute == 2 * (fl_block - fl_mlp - fl_res));
static_assert(sel.flops_fwd == full.flops_fwd && sel.flops_bwd == full.flops_bwd);
// every other block is the same selection; the first two another with the same bytes
static_assert(plan<Train<models::Llama<models::tiny_llama, Apply<Checkpointed<>, EveryKth<2>>>, Batch<2>, Seq<64>, AdamW>>()
                  .peak_bytes() == sel.peak_bytes());
using TinyFirst2 = models::Llama<models::tiny_llama, Apply<Checkpointed<>, FirstBlocks<2>>>;
static_assert(TinyFirst2::blocks::run_count == 2);
static_assert(plan<Train<TinyFirst2, Batch<2>, Seq<64>, AdamW>>().bytes(Role::saved_activation) == 2 * xD + 2 * block + xD + rstd);
// selecting every block is EveryBlock, one Repeat, the same plan
using TinyFirst4 = models::Llama<models::tiny_llama, Apply<Checkpointed<>, FirstBlocks<4>>>;
static_assert(TinyFirst4::blocks::run_count == 1);
static_assert(plan<Train<TinyFirst4, Batch<2>, Seq<64>, AdamW>>().peak_bytes() == ckpt.peak_bytes());
// where activations dominate (Batch 16 x Seq 256: 4,096 tokens), the peak
// falls with each block checkpointed
constexpr auto big_full = plan<Train<Tiny, Batch<16>, Seq<256>, AdamW>>();
constexpr auto big_sel = plan<Train<TinySel, Batch<16>, Seq<256>, AdamW>>();
constexpr auto big_ckpt = plan<Train<TinyCkpt, Batch<16>, Seq<256>, AdamW>>();
static_assert(big_full.peak_bytes() > big_sel.peak_bytes() && big_sel.peak_bytes() > big_ckpt.peak_bytes());

// ============================================================================
// 2c. Part of every block: the MLP's activation recomputed (On<mlp_act>)
// ============================================================================
// silu(g) * u and down_proj are one checkpointed segment: g and u stay saved
// (the activation's backward reads them), s = silu(g) * u is not kept but
// recomputed before down_proj's backward (5 N F FLOPs, 3 x 128 x 768 x 5 ...
// per block: the SiLU-mul line of fl_block); down_proj is not re-run (no
// backward reads its output).
using TinyAct = models::Llama<models::tiny_llama, Apply<Checkpointed<>, On<mlp_act>>>;
constexpr auto act = plan<Train<TinyAct, Batch<2>, Seq<64>, AdamW>>();
static_assert(act.valid());
static_assert(act.bytes(Role::saved_activation) == 4 * (block - xF) + xD + rstd);
static_assert(act.bytes(Role::saved_activation) == 6'959'616);
static_assert(act.bytes(Role::recompute) == 4 * xF);
static_assert(act.flops_recompute == 4 * 5 * N * F);
// with whole blocks checkpointed too, the block's recompute makes s anyway: EveryBlock's plan
static_assert(plan<Train<models::Llama<models::tiny_llama, Apply<Checkpointed<>, On<mlp_act>>, Apply<Checkpointed<>, EveryBlock>>,
                         Batch<2>, Seq<64>, AdamW>>()
                  .flops_recompute == ckpt.flops_recompute);

// ============================================================================
// 3. QLoRA (NF4 + double quantization, r = 16 on all 7 projections), BF16,
//    AdamW8bit, checkpointed, Batch 1, Seq 100: sizes that need rounding
// ============================================================================
using All7 = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;
using TinyQLoRA = models::Llama<models::tiny_llama, Apply<Quantized<NF4DQ, LoRA<16>>, All7>>;
using TinyQLoRACkpt = models::Llama<models::tiny_llama, Apply<Quantized<NF4DQ, LoRA<16>>, All7>,
                                    Apply<Checkpointed<>, EveryBlock>>;
constexpr auto qlora = plan<Train<TinyQLoRA, Batch<1>, Seq<100>, Precision<BF16>, AdamW8bit>>();
constexpr auto qlora_ckpt = plan<Train<TinyQLoRACkpt, Batch<1>, Seq<100>, Precision<BF16>, AdamW8bit>>();
static_assert(qlora.valid() && qlora_ckpt.valid());
static_assert(qlora.peak_bytes() * 100 <= qlora.lower_bound() * 105);
static_assert(qlora_ckpt.peak_bytes() * 100 <= qlora_ckpt.lower_bound() * 105);

// LoRA: A (16, in) + B (out, 16) per projection = 16 (in + out):
//   q 8,192  k 6,144  v 6,144  o 8,192  gate 16,384  up 16,384  down 16,384 = 77,824 per layer
static_assert(qlora.trainable_parameters() == 4 * 77'824);
static_assert(qlora.parameters() == params + 4 * 77'824);
// weights per layer: NF4 codes (n / 2): q 32,768 k 16,384 v 16,384 o 32,768,
// gate / up / down 98,304 each; two bf16 norms 512 B each; bf16 adapters
// 2 x 77,824 = 155,648 B (every A / B a multiple of 256 B). Plus embed_tokens
// and lm_head (65,536 x 2 B each) and the final norm (512 B).
constexpr int64_t codes_layer = 32'768 + 16'384 + 16'384 + 32'768 + 3 * 98'304;
static_assert(codes_layer == 393'216);
static_assert(qlora.bytes(Role::weights) == 4 * (codes_layer + 2 * 512 + 155'648) + 2 * 131'072 + 512);
static_assert(qlora.bytes(Role::weights) == 2'462'208);
// NF4+DQ scales: blocks = n / 64 bytes + ceil(blocks / 256) f32 + one f32 offset, rounded to 256:
//   q, o:     1,024 blocks -> 1,024 + 4 * 4 + 4 = 1,044 -> 1,280
//   k, v:       512 blocks ->   512 + 2 * 4 + 4 =   524 ->   768
//   mlp:      3,072 blocks -> 3,072 + 12 * 4 + 4 = 3,124 -> 3,328
// plus the code tables once: 16 NF4 values + 256 dynamic-map values, f32: 1,088 -> 1,280
static_assert(qlora.bytes(Role::quant_scales) == 4 * (2 * 1'280 + 2 * 768 + 3 * 3'328) + 1'280);
static_assert(qlora.bytes(Role::quant_scales) == 57'600);
// trainable: f32 master 4 B, bf16 grads 2 B per element (all multiples of 256)
static_assert(qlora.bytes(Role::master_weights) == 4 * 4 * 77'824);
static_assert(qlora.bytes(Role::grads) == 2 * 4 * 77'824);
// AdamW8bit: per tensor 2 (n + ceil(n / 256) * 4), rounded to 256:
//   n =  4,096 (A of the 6 projections but down; B of q, o, down: 9 tensors) -> 8,320 -> 8,448
//   n =  2,048 (B of k, v: 2 tensors)                                        -> 4,160 -> 4,352
//   n = 12,288 (B of gate, up; A of down: 3 tensors)                         -> 24,960 -> 25,088
// per layer: 9 x 8,448 + 2 x 4,352 + 3 x 25,088 = 160,000; plus the two dynamic maps (2 KiB) once
static_assert(9 * 8'448 + 2 * 4'352 + 3 * 25'088 == 160'000);
static_assert(qlora.bytes(Role::optimizer_state) == 4 * 160'000 + 2'048);
// batch io: ids and targets 100 * 4 = 400 -> 512 B each, the loss 4 -> 256
static_assert(qlora.bytes(Role::batch_io) == 512 + 512 + 256);

// Saved activations at N = 100, bf16 (stats and lse stay f32):
constexpr int64_t bD = 100 * 256 * 2;    // 51,200 (a multiple of 256)
constexpr int64_t bKV = 100 * 128 * 2;   // 25,600
constexpr int64_t bF = 100 * 768 * 2;    // 153,600
constexpr int64_t brstd = 512;           // 100 * 4 = 400 -> 512
constexpr int64_t blse = 1'792;          // 1 * 4 * 100 * 4 = 1,600 -> 1,792
constexpr int64_t bax = 3'328;           // LoRA's A x: 100 * 16 * 2 = 3,200 -> 3,328
// The frozen base projections save nothing; each LoRA op saves its input
// (h1 for q, k, v — one tensor; o for o_proj — attention saves it anyway; h2
// for gate, up; s for down) and its A x.
constexpr int64_t qblock = bD + brstd + bD + (bD + bKV + bKV + bD + blse) + bD + brstd + bD + 3 * bF + 7 * bax;
static_assert(qblock == 845'312);
static_assert(qlora.bytes(Role::saved_activation) == 4 * qblock + bD + brstd);
static_assert(qlora_ckpt.bytes(Role::saved_activation) == 4 * bD + bD + brstd);
static_assert(qlora_ckpt.bytes(Role::saved_activation) == 256'512);
static_assert(qlora_ckpt.peak_bytes() < qlora.peak_bytes());

}  // namespace
