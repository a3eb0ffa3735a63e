#pragma once
// Llama-family models (RMSNorm, RoPE, GQA, SwiGLU), with the published Hugging
// Face configurations as presets: Llama 2 / 3 / 3.1 / 3.2; Qwen2 / Qwen2.5,
// the same network with biases on the q, k and v projections and RMSNorm's
// epsilon 1e-6 (transformers' Qwen2ForCausalLM); Qwen3, which drops the
// biases, normalizes each query and key head (q_norm, k_norm: RMSNorm over
// head_dim) before RoPE and sets head_dim apart from hidden / heads
// (Qwen3ForCausalLM); Mistral, whose attention sees a sliding window of the
// last sliding_window positions (MistralForCausalLM).
//
//   models::Llama<models::llama3_8b, Apply<QLoRA, On<q_proj, v_proj>>, Apply<Checkpointed<>, EveryBlock>>
//
// Parameter names follow Hugging Face's LlamaForCausalLM: embed_tokens,
// layers.{i}.self_attn.{q,k,v,o}_proj, layers.{i}.mlp.{gate,up,down}_proj,
// layers.{i}.{input,post_attention}_layernorm, norm, lm_head.
#include "../layers/attention.hpp"
#include "../layers/block.hpp"
#include "../layers/block_runs.hpp"
#include "../layers/embedding.hpp"
#include "../layers/lm_head.hpp"
#include "../layers/mlp.hpp"
#include "../layers/norms.hpp"
#include "../layers/repeat.hpp"
#include "../policies/apply.hpp"

namespace headroom::models {

// Which transformers class a LlamaConfig describes: config.json's model_type
// ("llama", "qwen2") and architectures.
enum class LlamaArch : std::uint8_t { llama, qwen2, qwen3, mistral };

struct LlamaConfig {
  std::int64_t vocab = 0;
  std::int64_t dim = 0;
  std::int64_t ffn = 0;
  int layers = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t max_positions = 0;
  bool tied = false;
  std::int64_t rope_theta = 10000;  // RoPE base (rope_theta in config.json)
  math::RopeScalingConfig rope_scaling{};  // Llama 3.1's (rope_scaling with rope_type "llama3"); off by default
  Real rms_norm_eps = real(1e-5);          // RMSNorm's epsilon (rms_norm_eps)
  bool attention_bias = false;       // a bias on q_proj, k_proj, v_proj (Qwen2)
  LlamaArch arch = LlamaArch::llama;
  std::int64_t head_dim = 0;         // a head's width (head_dim); 0: dim / heads
  bool qk_norm = false;              // RMSNorm on each query and key head before RoPE (Qwen3's q_norm, k_norm)
  std::int64_t sliding_window = 0;   // attention sees the last sliding_window positions (Mistral); 0: all

  constexpr std::int64_t head_width() const { return head_dim > 0 ? head_dim : heads > 0 ? dim / heads : 0; }
};

// config.json of meta-llama/Llama-2-7b-hf
inline constexpr LlamaConfig llama2_7b{32000, 4096, 11008, 32, 32, 32, 4096, false};
// config.json of meta-llama/Meta-Llama-3-8B
inline constexpr LlamaConfig llama3_8b{128256, 4096, 14336, 32, 32, 8, 8192, false, 500000};
// config.json of meta-llama/Llama-3.1-8B (rope_scaling: factor 8, low / high
// frequency factors 1 / 4, original context 8192)
inline constexpr LlamaConfig llama3_1_8b{128256, 4096, 14336, 32, 32, 8, 131072, false, 500000,
                                         {real(8), real(1), real(4), 8192}};
// config.json of meta-llama/Llama-3.2-1B (rope_scaling: factor 32, 1 / 4, 8192)
inline constexpr LlamaConfig llama3_2_1b{128256, 2048, 8192, 16, 32, 8, 131072, true, 500000,
                                         {real(32), real(1), real(4), 8192}};
// config.json of Qwen/Qwen2.5-0.5B (embeddings tied) and Qwen/Qwen2.5-7B:
// rope_theta 1e6, rms_norm_eps 1e-6, biases on q, k, v; max_position_embeddings
// is 32768 here (Seq may not exceed it; the files may say more)
inline constexpr LlamaConfig qwen2_5_0_5b{151936, 896, 4864, 24, 14, 2, 32768, true, 1000000, {}, real(1e-6), true,
                                          LlamaArch::qwen2};
inline constexpr LlamaConfig qwen2_5_7b{152064, 3584, 18944, 28, 28, 4, 32768, false, 1000000, {}, real(1e-6), true,
                                        LlamaArch::qwen2};
// config.json of Qwen/Qwen3-0.6B (embeddings tied; head_dim 128 with hidden
// 1024 and 16 heads) and Qwen/Qwen3-8B: rope_theta 1e6, rms_norm_eps 1e-6, no
// attention bias, q_norm / k_norm; max_position_embeddings 40960
inline constexpr LlamaConfig qwen3_0_6b{.vocab = 151936, .dim = 1024, .ffn = 3072, .layers = 28, .heads = 16, .kv_heads = 8,
                                        .max_positions = 40960, .tied = true, .rope_theta = 1000000, .rms_norm_eps = real(1e-6),
                                        .arch = LlamaArch::qwen3, .head_dim = 128, .qk_norm = true};
inline constexpr LlamaConfig qwen3_8b{.vocab = 151936, .dim = 4096, .ffn = 12288, .layers = 36, .heads = 32, .kv_heads = 8,
                                      .max_positions = 40960, .tied = false, .rope_theta = 1000000, .rms_norm_eps = real(1e-6),
                                      .arch = LlamaArch::qwen3, .head_dim = 128, .qk_norm = true};
// config.json of mistralai/Mistral-7B-v0.1: GQA 32 / 8, sliding_window 4096
// (each position attends to itself and the 4095 before it), 32768 positions
inline constexpr LlamaConfig mistral_7b{.vocab = 32000, .dim = 4096, .ffn = 14336, .layers = 32, .heads = 32, .kv_heads = 8,
                                        .max_positions = 32768, .tied = false, .rope_theta = 10000,
                                        .arch = LlamaArch::mistral, .sliding_window = 4096};
// A small Llama-style model that trains on two CPU cores in minutes
// (byte-level vocabulary, 4 layers, d 256, 4 heads, 2 KV heads).
inline constexpr LlamaConfig tiny_llama{256, 256, 768, 4, 4, 2, 512, false};

using LlamaSlots = type_list<q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, mlp_act>;

template <LlamaConfig C, class... Mods>
struct Llama {
  static_assert((is_modifier_v<Mods> && ...), "Llama<Config, Mods...>: every modifier must be an Apply<Recipe, On<...>> or Apply<Policy, EveryBlock>");
  HEADROOM_REQUIRE((detail::targets_known<LlamaSlots, Mods>::value && ...),
                   "Llama: Apply<Recipe, On<...>> names a projection Llama does not have: {} (it has q_proj k_proj v_proj "
                   "o_proj gate_proj up_proj down_proj)",
                   detail::unknown_target<LlamaSlots, Mods...>());
  HEADROOM_REQUIRE(C.heads > 0 && (C.head_dim > 0 || C.dim % C.heads == 0),
                   "Llama: the number of heads ({}) must divide the model width ({})", C.heads, C.dim);
  static constexpr std::int64_t D = C.dim, F = C.ffn, H = C.heads, KV = C.kv_heads, hd = C.head_width();
  static constexpr LlamaConfig config = C;

  template <class Slot, std::int64_t In, std::int64_t Out, bool Bias = false>
  using proj = projection_t<type_list<Slot>, Linear<In, Out, Bias>, Mods...>;
  using attention = Attention<D, H, KV, Positions::rope, proj<q_proj, D, H * hd, C.attention_bias>,
                              proj<k_proj, D, KV * hd, C.attention_bias>, proj<v_proj, D, KV * hd, C.attention_bias>,
                              proj<o_proj, H * hd, D>, AttentionOptions{C.rope_theta, C.rope_scaling, hd, C.sliding_window},
                              std::conditional_t<C.qk_norm, RMSNorm<hd, C.rms_norm_eps>, void>>;
  using norm = RMSNorm<D, C.rms_norm_eps>;
  static_assert(activation_policy_known<Mods...>,
                "Llama: On<mlp_act> takes Checkpointed<> alone: the activation has no weights for another recipe to wrap");
  using mlp = SwiGLU<D, F, proj<gate_proj, D, F>, proj<up_proj, D, F>, proj<down_proj, F, D>, recomputes_activation<Mods...>>;
  using base_block = PreNormBlock<LlamaBlockNames, norm, attention, norm, mlp>;
  HEADROOM_REQUIRE(detail::block_out_of_range<Mods...>(C.layers) < 0,
                   "Llama: a block selector names block {}, but the model has {} blocks (0 to {})",
                   detail::block_out_of_range<Mods...>(C.layers), C.layers, C.layers - 1);
  template <int I>
  using block_at = block_at_t<base_block, I, C.layers, Mods...>;
  using blocks = BlockRuns<C.layers, block_at, !selects_blocks<Mods...>>;  // one Repeat per run of equal blocks

  // One LoRA adapter per projection, however many Applys name it.
  template <class Slot>
  static constexpr int adapters_on = adapter_count<project_t<type_list<Slot>, Linear<1, 1>, Mods...>>::value;
  HEADROOM_REQUIRE(adapters_on<q_proj> <= 1, "Llama: the Apply<...>s put {} LoRA adapters on q_proj; a projection takes at most one",
                   adapters_on<q_proj>);
  HEADROOM_REQUIRE(adapters_on<k_proj> <= 1, "Llama: the Apply<...>s put {} LoRA adapters on k_proj; a projection takes at most one",
                   adapters_on<k_proj>);
  HEADROOM_REQUIRE(adapters_on<v_proj> <= 1, "Llama: the Apply<...>s put {} LoRA adapters on v_proj; a projection takes at most one",
                   adapters_on<v_proj>);
  HEADROOM_REQUIRE(adapters_on<o_proj> <= 1, "Llama: the Apply<...>s put {} LoRA adapters on o_proj; a projection takes at most one",
                   adapters_on<o_proj>);
  HEADROOM_REQUIRE(adapters_on<gate_proj> <= 1,
                   "Llama: the Apply<...>s put {} LoRA adapters on gate_proj; a projection takes at most one", adapters_on<gate_proj>);
  HEADROOM_REQUIRE(adapters_on<up_proj> <= 1, "Llama: the Apply<...>s put {} LoRA adapters on up_proj; a projection takes at most one",
                   adapters_on<up_proj>);
  HEADROOM_REQUIRE(adapters_on<down_proj> <= 1,
                   "Llama: the Apply<...>s put {} LoRA adapters on down_proj; a projection takes at most one", adapters_on<down_proj>);

  static constexpr std::string_view kind = "Llama";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  static constexpr std::int64_t max_seq = C.max_positions;
  static constexpr bool adapters = uses_adapters<Mods...>;
  using children = concat_t<type_list<Embedding<C.vocab, D>>, typename blocks::repeats, type_list<norm, LMHeadLoss<C.vocab, D, C.tied>>>;

  static constexpr Ref build(graph::Builder& b, Ref tokens) {
    if constexpr (adapters) b.push_frozen();
    Ref x = tokens;  // with pipeline parallelism, a stage builds its part (layers/repeat.hpp)
    if (b.cfg.first_stage()) x = b.child<Embedding<C.vocab, D>>("embed_tokens", tokens);
    else if (C.tied && b.cfg.last_stage()) b.declare<Embedding<C.vocab, D>>("embed_tokens");  // the tied head's copy
    x = blocks::build(b, "layers", x);
    if (b.cfg.last_stage()) {
      x = b.child<norm>("norm", x);
      x = b.child<LMHeadLoss<C.vocab, D, C.tied>>("lm_head", x);  // the loss
    }
    if constexpr (adapters) b.pop_frozen();
    return x;
  }
};

}  // namespace headroom::models
