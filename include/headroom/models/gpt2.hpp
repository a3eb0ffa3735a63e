#pragma once
// GPT-2 (LayerNorm, learned positions, fused c_attn, GELU-tanh MLP, biases,
// LM head tied to wte), with the published Hugging Face configurations.
// Parameter names follow GPT2LMHeadModel: wte, wpe, h.{i}.ln_1,
// h.{i}.attn.c_attn, h.{i}.attn.c_proj, h.{i}.ln_2, h.{i}.mlp.c_fc,
// h.{i}.mlp.c_proj, ln_f.
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

struct GPT2Config {
  std::int64_t vocab = 0;
  std::int64_t dim = 0;
  int layers = 0;
  std::int64_t heads = 0;
  std::int64_t max_positions = 0;
};

// config.json of openai-community/gpt2 (124M) and gpt2-medium (355M)
inline constexpr GPT2Config gpt2_124m{50257, 768, 12, 12, 1024};
inline constexpr GPT2Config gpt2_355m{50257, 1024, 24, 16, 1024};

using GPT2Slots = type_list<c_attn, c_proj, attn_c_proj, c_fc, mlp_c_proj, mlp_act>;

template <GPT2Config C, class... Mods>
struct GPT2 {
  static_assert((is_modifier_v<Mods> && ...), "GPT2<Config, Mods...>: every modifier must be an Apply<Recipe, On<...>> or Apply<Policy, EveryBlock>");
  HEADROOM_REQUIRE((detail::targets_known<GPT2Slots, Mods>::value && ...),
                   "GPT2: Apply<Recipe, On<...>> names a projection GPT-2 does not have: {} (it has c_attn, c_proj, c_fc; "
                   "attn_c_proj and mlp_c_proj pick one c_proj)",
                   detail::unknown_target<GPT2Slots, Mods...>());
  HEADROOM_REQUIRE(C.heads > 0 && C.dim % C.heads == 0, "GPT2: the number of heads ({}) must divide the model width ({})",
                   C.heads, C.dim);
  static constexpr std::int64_t D = C.dim, F = 4 * C.dim;
  static constexpr GPT2Config config = C;

  template <class Slots, std::int64_t In, std::int64_t Out>
  using proj = projection_t<Slots, Linear<In, Out, true>, Mods...>;
  using attention = FusedAttention<D, C.heads, proj<type_list<c_attn>, D, 3 * D>, proj<type_list<c_proj, attn_c_proj>, D, D>>;
  static_assert(activation_policy_known<Mods...>,
                "GPT2: On<mlp_act> takes Checkpointed<> alone: the activation has no weights for another recipe to wrap");
  using mlp = MLP<D, F, proj<type_list<c_fc>, D, F>, proj<type_list<c_proj, mlp_c_proj>, F, D>, recomputes_activation<Mods...>>;
  using base_block = PreNormBlock<GPT2BlockNames, LayerNorm<D>, attention, LayerNorm<D>, mlp>;
  HEADROOM_REQUIRE(detail::block_out_of_range<Mods...>(C.layers) < 0,
                   "GPT2: a block selector names block {}, but the model has {} blocks (0 to {})",
                   detail::block_out_of_range<Mods...>(C.layers), C.layers, C.layers - 1);
  template <int I>
  using block_at = block_at_t<base_block, I, C.layers, Mods...>;
  using blocks = BlockRuns<C.layers, block_at, !selects_blocks<Mods...>>;  // one Repeat per run of equal blocks

  // One LoRA adapter per projection, however many Applys name it (c_proj
  // names both attn.c_proj and mlp.c_proj).
  template <class Slots>
  static constexpr int adapters_on = adapter_count<project_t<Slots, Linear<1, 1, true>, Mods...>>::value;
  static constexpr int adapters_on_c_attn = adapters_on<type_list<c_attn>>;
  static constexpr int adapters_on_attn_c_proj = adapters_on<type_list<c_proj, attn_c_proj>>;
  static constexpr int adapters_on_c_fc = adapters_on<type_list<c_fc>>;
  static constexpr int adapters_on_mlp_c_proj = adapters_on<type_list<c_proj, mlp_c_proj>>;
  HEADROOM_REQUIRE(adapters_on_c_attn <= 1,
                   "GPT2: the Apply<...>s put {} LoRA adapters on attn.c_attn; a projection takes at most one",
                   adapters_on_c_attn);
  HEADROOM_REQUIRE(adapters_on_attn_c_proj <= 1,
                   "GPT2: the Apply<...>s put {} LoRA adapters on attn.c_proj; a projection takes at most one",
                   adapters_on_attn_c_proj);
  HEADROOM_REQUIRE(adapters_on_c_fc <= 1,
                   "GPT2: the Apply<...>s put {} LoRA adapters on mlp.c_fc; a projection takes at most one", adapters_on_c_fc);
  HEADROOM_REQUIRE(adapters_on_mlp_c_proj <= 1,
                   "GPT2: the Apply<...>s put {} LoRA adapters on mlp.c_proj; a projection takes at most one",
                   adapters_on_mlp_c_proj);

  static constexpr std::string_view kind = "GPT2";
  static constexpr std::int64_t in_features = 0, out_features = 0;
  static constexpr std::int64_t max_seq = C.max_positions;
  static constexpr bool adapters = uses_adapters<Mods...>;
  using children = concat_t<type_list<Embedding<C.vocab, D>, LearnedPositions<C.max_positions, D>>, typename blocks::repeats,
                            type_list<LayerNorm<D>, LMHeadLoss<C.vocab, D, true>>>;

  static constexpr Ref build(graph::Builder& b, Ref tokens) {
    if constexpr (adapters) b.push_frozen();
    Ref x = tokens;  // with pipeline parallelism, a stage builds its part (layers/repeat.hpp)
    if (b.cfg.first_stage()) {
      x = b.child<Embedding<C.vocab, D>>("wte", tokens);
      x = b.child<LearnedPositions<C.max_positions, D>>("wpe", x);
    } else if (b.cfg.last_stage()) {
      b.declare<Embedding<C.vocab, D>>("wte");  // the tied head's copy of the table (layers/pipeline_stages.hpp)
    }
    x = blocks::build(b, "h", x);
    if (b.cfg.last_stage()) {
      x = b.child<LayerNorm<D>>("ln_f", x);
      x = b.child<LMHeadLoss<C.vocab, D, true>>("lm_head", x);  // the loss
    }
    if constexpr (adapters) b.pop_frozen();
    return x;
  }
};

}  // namespace headroom::models
