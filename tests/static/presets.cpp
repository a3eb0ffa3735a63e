// Parameter counts of the presets equal the published Hugging Face figures, and
// LoRA's trainable counts equal what PEFT's print_trainable_parameters() shows.
//
// Plans are evaluated at compile time here, so this file keeps to the small and
// medium presets plus ONE Llama-3-8B QLoRA plan (~10-20 s); the other big
// presets are counted at run time in tests/runtime/presets.cpp.
#include <headroom/headroom.hpp>

namespace {

using namespace headroom;
using std::int64_t;

// LoRA adds A (r x in) and B (out x r): r * (in + out) per adapted projection.
constexpr int64_t lora(int64_t r, int64_t in, int64_t out) { return r * (in + out); }
constexpr int64_t a256(int64_t n) { return (n + 255) / 256 * 256; }

// ---- GPT-2 -------------------------------------------------------------------
// GPT2LMHeadModel: wte (V, D), wpe (P, D); per block ln_1 (w, b), c_attn
// (D -> 3D, bias), attn.c_proj (D -> D, bias), ln_2 (w, b), c_fc (D -> 4D, bias),
// mlp.c_proj (4D -> D, bias); ln_f (w, b); lm_head tied to wte.
constexpr int64_t gpt2_block(int64_t D) {
  return 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + 2 * D + (D * 4 * D + 4 * D) + (4 * D * D + D);
}
constexpr int64_t gpt2_params(int64_t V, int64_t D, int64_t L, int64_t P) {
  return V * D + P * D + L * gpt2_block(D) + 2 * D;
}
// openai-community/gpt2: vocab 50257, n_embd 768, n_layer 12, n_positions 1024
static_assert(gpt2_block(768) == 7'087'872);
static_assert(gpt2_params(50257, 768, 12, 1024) == 124'439'808);  // the published 124,439,808
// openai-community/gpt2-medium: n_embd 1024, n_layer 24
static_assert(gpt2_params(50257, 1024, 24, 1024) == 354'823'168);  // the published 354,823,168
// PEFT, GPT-2, LoRA r=8 on c_attn: "trainable params: 294,912 || all params: 124,734,720"
static_assert(12 * lora(8, 768, 3 * 768) == 294'912);

using GPT2 = models::GPT2<models::gpt2_124m>;
constexpr auto gpt2 = plan<Train<GPT2, Batch<1>, Seq<64>>>();
static_assert(gpt2.parameters() == 124'439'808);
static_assert(gpt2.trainable_parameters() == 124'439'808);
static_assert(gpt2.valid());
// F32 full fine-tuning: every weight 4 B, its grad 4 B and AdamW's two moments
// 8 B; every tensor's bytes are a multiple of 256 (768 * 4 = 12 * 256).
static_assert(gpt2.bytes(Role::weights) == 4 * 124'439'808);
static_assert(gpt2.bytes(Role::grads) == 4 * 124'439'808);
static_assert(gpt2.bytes(Role::optimizer_state) == 8 * 124'439'808);
static_assert(gpt2.bytes(Role::master_weights) == 0);

using GPT2LoRA = models::GPT2<models::gpt2_124m, Apply<LoRA<8>, On<c_attn>>>;
constexpr auto gpt2_lora = plan<Train<GPT2LoRA, Batch<1>, Seq<64>>>();
static_assert(gpt2_lora.trainable_parameters() == 294'912);
static_assert(gpt2_lora.parameters() == 124'734'720);
static_assert(gpt2_lora.parameters() == 124'439'808 + 294'912);
// only the adapters train: 24 tensors (A and B in 12 blocks), 4 B grads each,
// A (8, 768) and B (2304, 8) in f32 are 24,576 and 73,728 B (multiples of 256)
static_assert(gpt2_lora.bytes(Role::grads) == 4 * 294'912);
static_assert(gpt2_lora.bytes(Role::optimizer_state) == 8 * 294'912);
static_assert(gpt2_lora.bytes(Role::weights) == 4 * 124'734'720);

using GPT2Medium = models::GPT2<models::gpt2_355m>;
constexpr auto gpt2_medium = plan<Train<GPT2Medium, Batch<1>, Seq<32>, Precision<BF16>>>();
static_assert(gpt2_medium.parameters() == 354'823'168);
static_assert(gpt2_medium.trainable_parameters() == 354'823'168);
// BF16: 2 B weights and grads, f32 master copies (4 B) and AdamW (8 B)
static_assert(gpt2_medium.bytes(Role::weights) == 2 * 354'823'168);
static_assert(gpt2_medium.bytes(Role::master_weights) == 4 * 354'823'168);
static_assert(gpt2_medium.bytes(Role::grads) == 2 * 354'823'168);
static_assert(gpt2_medium.bytes(Role::optimizer_state) == 8 * 354'823'168LL);

// ---- Llama ----------------------------------------------------------------------
// LlamaForCausalLM: embed_tokens (V, D); per layer q (H hd, D), k and v
// (KV hd, D), o (D, H hd), gate and up (F, D), down (D, F), two RMSNorm weights
// (D); norm (D); lm_head (V, D) unless tied to embed_tokens.
constexpr int64_t llama_layer(int64_t D, int64_t F, int64_t H, int64_t KV) {
  const int64_t hd = D / H;
  return D * H * hd + 2 * D * KV * hd + H * hd * D + 3 * D * F + 2 * D;
}
constexpr int64_t llama_params(int64_t V, int64_t D, int64_t F, int64_t L, int64_t H, int64_t KV, bool tied) {
  return V * D + L * llama_layer(D, F, H, KV) + D + (tied ? 0 : V * D);
}
// meta-llama/Llama-2-7b-hf: vocab 32000, hidden 4096, intermediate 11008, 32 layers, 32 heads, 32 KV heads
static_assert(llama_params(32000, 4096, 11008, 32, 32, 32, false) == 6'738'415'616);
// meta-llama/Meta-Llama-3-8B: vocab 128256, hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads
static_assert(llama_layer(4096, 14336, 32, 8) == 218'112'000);
static_assert(llama_params(128256, 4096, 14336, 32, 32, 8, false) == 8'030'261'248);
// meta-llama/Llama-3.2-1B: vocab 128256, hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads, tied
static_assert(llama_params(128256, 2048, 8192, 16, 32, 8, true) == 1'235'814'400);
// tiny_llama (models/llama.hpp): vocab 256, d 256, ffn 768, 4 layers, 4 heads, 2 KV heads, untied:
//   embed 65,536 + 4 x (q 65,536 + k 32,768 + v 32,768 + o 65,536 + 3 x 196,608 + 512) + norm 256 + lm_head 65,536
static_assert(llama_layer(256, 768, 4, 2) == 786'944);
static_assert(llama_params(256, 256, 768, 4, 4, 2, false) == 3'279'104);

// PEFT, Llama-2-7B, LoRA r=8 on q_proj, v_proj: "trainable params: 4,194,304 || all params: 6,742,609,920"
static_assert(32 * (lora(8, 4096, 4096) + lora(8, 4096, 4096)) == 4'194'304);
static_assert(6'738'415'616 + 4'194'304 == 6'742'609'920);
// PEFT, Llama-3-8B, LoRA r=16 on all 7 projections:
// "trainable params: 41,943,040 || all params: 8,072,204,288"
constexpr int64_t llama3_8b_lora16_layer = lora(16, 4096, 4096)      // q_proj
                                           + lora(16, 4096, 1024)    // k_proj (8 KV heads x 128)
                                           + lora(16, 4096, 1024)    // v_proj
                                           + lora(16, 4096, 4096)    // o_proj
                                           + lora(16, 4096, 14336)   // gate_proj
                                           + lora(16, 4096, 14336)   // up_proj
                                           + lora(16, 14336, 4096);  // down_proj
static_assert(llama3_8b_lora16_layer == 1'310'720);
static_assert(32 * llama3_8b_lora16_layer == 41'943'040);
static_assert(8'030'261'248 + 41'943'040 == 8'072'204'288);

constexpr auto tiny = plan<Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<32>>>();
static_assert(tiny.parameters() == 3'279'104);
static_assert(tiny.trainable_parameters() == 3'279'104);
static_assert(tiny.valid());

// ---- the one Llama-3-8B plan of this file: QLoRA with double quantization -----
using All7 = On<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj>;
using QLoRA8B = models::Llama<models::llama3_8b, Apply<Quantized<NF4DQ, LoRA<16>>, All7>,
                              Apply<Offloaded<Checkpointed<>>, EveryBlock>>;
constexpr auto qlora_8b = plan<Train<QLoRA8B, Batch<1>, Seq<512>, Precision<BF16>, AdamW>>();
static_assert(qlora_8b.parameters() == 8'072'204'288);
static_assert(qlora_8b.trainable_parameters() == 41'943'040);

// Stored bytes, by hand. Projection elements per layer:
//   q 4096*4096 + k 4096*1024 + v 4096*1024 + o 4096*4096 + 3 * 4096*14336
constexpr int64_t proj_q = 4096LL * 4096, proj_kv = 4096LL * 1024, proj_ffn = 4096LL * 14336;
static_assert(2 * proj_q + 2 * proj_kv + 3 * proj_ffn == 218'103'808);
// NF4 codes: two per byte (all multiples of 256).
constexpr int64_t codes = 32 * (218'103'808LL / 2);
// bf16 dense weights: embed_tokens and lm_head (128256 x 4096 each), 65 RMSNorm
// weights of 4096 (8,192 B each), and the LoRA adapters (41,943,040 elements;
// every A / B tensor's bytes are a multiple of 256: 16 * 1024 * 2 = 32,768).
constexpr int64_t dense = 2 * (2 * 128256LL * 4096) + 65 * (4096 * 2) + 2 * 41'943'040;
static_assert(qlora_8b.bytes(Role::weights) == codes + dense);
static_assert(codes + dense == 5'675'425'792);
// NF4 + double quantization (bitsandbytes): per tensor one byte per block of 64,
// one f32 absmax per 256 such bytes and one f32 offset, rounded up to 256:
//   q, o:   262,144 blocks -> 262,144 + 1,024 * 4 + 4 =   266,244 ->   266,496
//   k, v:    65,536 blocks ->  65,536 +   256 * 4 + 4 =    66,564 ->    66,816
//   mlp:    917,504 blocks -> 917,504 + 3,584 * 4 + 4 =   931,844 ->   932,096
// plus the code tables once: 16 NF4 values + 256-entry dynamic map, f32 = 1,088 -> 1,280.
constexpr int64_t dq(int64_t n) { return a256(n / 64 + (n / 64 + 255) / 256 * 4 + 4); }
static_assert(dq(proj_q) == 266'496 && dq(proj_kv) == 66'816 && dq(proj_ffn) == 932'096);
static_assert(qlora_8b.bytes(Role::quant_scales) == 32 * (2 * dq(proj_q) + 2 * dq(proj_kv) + 3 * dq(proj_ffn)) + 1'280);
static_assert(qlora_8b.bytes(Role::quant_scales) == 110'814'464);
// adapters only: f32 master copies, bf16 grads, AdamW f32 moments
static_assert(qlora_8b.bytes(Role::master_weights) == 4 * 41'943'040);
static_assert(qlora_8b.bytes(Role::grads) == 2 * 41'943'040);
static_assert(qlora_8b.bytes(Role::optimizer_state) == 8 * 41'943'040);
// Offloaded<Checkpointed<>> on every block: the 32 block inputs (512 x 4096 bf16
// = 4 MiB each) are what goes to the offload tier
static_assert(qlora_8b.peak_bytes(Tier::offload) == 32 * (512 * 4096 * 2));

}  // namespace
