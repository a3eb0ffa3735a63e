// Generation with a planned KV cache: the plan's figures against the formula,
// decoding token by token reproduces the training forward's loss, sampling
// is deterministic for a seed, and misuse is refused with a clear error.
#include <catch2/catch.hpp>

#include <cmath>
#include <headroom/headroom.hpp>
#include <headroom/train/host/generator.hpp>
#include <vector>

using namespace headroom;

namespace {
constexpr models::LlamaConfig llama_cfg{48, 64, 128, 2, 4, 2, 64, false};
constexpr models::GPT2Config gpt2_cfg{48, 64, 2, 4, 32};
// Qwen3: q / k norms on heads of 24 (apart from 64 / 4); Mistral: a window of
// 7 positions, over more positions than one 64-row tile
constexpr models::LlamaConfig qwen3_cfg{.vocab = 48, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                        .max_positions = 64, .arch = models::LlamaArch::qwen3, .head_dim = 24,
                                        .qk_norm = true};
constexpr models::LlamaConfig mistral_cfg{.vocab = 48, .dim = 64, .ffn = 128, .layers = 2, .heads = 4, .kv_heads = 2,
                                          .max_positions = 96, .arch = models::LlamaArch::mistral, .sliding_window = 7};

// mean next-token loss of a sequence, decoded one token at a time
template <class G>
double decode_loss(G& g, const std::vector<std::int32_t>& tok, const std::vector<std::int32_t>& tgt) {
  g.reset();
  double s = 0;
  for (std::size_t i = 0; i < tok.size(); ++i) {
    g.feed_one(std::span<const std::int32_t>(&tok[i], 1));
    const auto* z = g.logits();
    double m = z[0];
    for (std::int64_t v = 1; v < G::vocab(); ++v) m = std::max(m, static_cast<double>(z[v]));
    double e = 0;
    for (std::int64_t v = 0; v < G::vocab(); ++v) e += std::exp(z[v] - m);
    s += m + std::log(e) - z[tgt[i]];
  }
  return s / static_cast<double>(tok.size());
}

template <class R, class G>
void decode_matches_training() {
  host::Trainer<R> t({.seed = 3});
  G g(t);
  CHECK(g.arena_bytes() == G::plan.arena_bytes());
  std::vector<std::int32_t> tok(R::seq), tgt(R::seq);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<std::int32_t>((i * 5 + 1) % 48);
  for (std::size_t i = 0; i + 1 < tok.size(); ++i) tgt[i] = tok[i + 1];
  CHECK(decode_loss(g, tok, tgt) == Approx(t.evaluate(tok, tgt)).epsilon(1e-12));
}
}  // namespace

TEST_CASE("KV cache bytes: 2 x layers x KV heads x head dim x context x batch x element bytes", "[host][generate]") {
  using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<64>>;
  using G = host::Generator<R, Context<512>, GenBatch<3>>;
  // tiny_llama: 4 layers, 2 KV heads of 64, f32
  CHECK(G::plan.kv_cache_bytes == 2 * 4 * 2 * 64 * 512 * 3 * 4);
  CHECK(G::plan.attention_layers == 4);
  CHECK(G::plan.weight_bytes == host::Trainer<R>::plan.bytes(Role::weights));
  CHECK(G::plan.arena_bytes() == G::plan.kv_cache_bytes + G::plan.activation_bytes + G::plan.scratch_bytes);
}

TEST_CASE("decoding with the KV cache reproduces the training forward (Llama, QLoRA)", "[host][generate]") {
  using R = Train<models::Llama<llama_cfg, Apply<Quantized<NF4, LoRA<4>>, On<q_proj, v_proj>>>, Batch<1>, Seq<20>,
                  Precision<DType::F64>, Workers<2>>;
  decode_matches_training<R, host::Generator<R, Context<20>>>();
}

TEST_CASE("decoding with the KV cache reproduces the training forward (GPT-2: positions, fused q|k|v)", "[host][generate]") {
  using R = Train<models::GPT2<gpt2_cfg>, Batch<1>, Seq<16>, Precision<DType::F64>>;
  decode_matches_training<R, host::Generator<R, Context<24>>>();
}

TEST_CASE("decoding reproduces the training forward (Qwen3: per-head q / k norms, Mistral: a sliding window)",
          "[host][generate]") {
  using Q = Train<models::Llama<qwen3_cfg>, Batch<1>, Seq<20>, Precision<DType::F64>>;
  using GQ = host::Generator<Q, Context<20>>;
  CHECK(GQ::plan.kv_cache_bytes == 2 * 2 * 2 * 24 * 20 * 8);  // layers x KV heads x head_dim 24 x context, f64
  decode_matches_training<Q, GQ>();
  using M = Train<models::Llama<mistral_cfg>, Batch<1>, Seq<80>, Precision<DType::F64>>;
  decode_matches_training<M, host::Generator<M, Context<80>>>();
}

TEST_CASE("sampling: greedy is the argmax, a seed fixes the text, the context is enforced", "[host][generate]") {
  using R = Train<models::Llama<llama_cfg>, Batch<1>, Seq<8>>;
  host::Trainer<R> t({.seed = 5});
  using G = host::Generator<R, Context<16>>;
  G a(t, 7), b(t, 7);
  const std::vector<std::int32_t> prompt{1, 2, 3};
  std::vector<std::int32_t> x(10), y(10);
  a.generate(prompt, x, {.temperature = 0.9, .top_k = 5});
  b.generate(prompt, y, {.temperature = 0.9, .top_k = 5});
  CHECK(x == y);
  a.reset();
  a.feed(prompt);
  const auto* z = a.logits();
  CHECK(a.sample({.temperature = 0}) == std::max_element(z, z + G::vocab()) - z);
  std::vector<std::int32_t> long_out(15);  // 3 + 14 fed > 16
  REQUIRE_THROWS_WITH(a.generate(prompt, long_out), Catch::Contains("planned context of 16"));
  const std::int32_t bad = 48;
  a.reset();
  REQUIRE_THROWS_WITH(a.feed_one(std::span<const std::int32_t>(&bad, 1)), Catch::Contains("outside the vocabulary"));
}
