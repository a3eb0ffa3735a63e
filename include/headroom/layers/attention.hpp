#pragma once
// Causal self-attention, flash style: forward keeps one log-sum-exp (f32; f64 in f64 runs) per
// (sequence, head, position) instead of the T x T probabilities; backward
// recomputes the scores tile by tile (Dao et al. 2022, FlashAttention-2).
// RoPE (Su et al. 2021) is applied to q and k as tiles are loaded, so no
// rotated copy exists; GQA shares each K/V head among Heads / KVHeads query heads.
//
// Attention<D, Heads, KVHeads, Rope, Q, K, V, O, Options, QKNorm>: separate
// projections (Llama, Qwen, Mistral). Options (AttentionOptions): the RoPE
// base and Llama 3.1's scaling of its frequencies (math/rope.hpp), a head
// width apart from D / Heads (Qwen3), a sliding window (Mistral: position i
// attends to the Window positions i - Window + 1 .. i). QKNorm: a norm over
// one head (RMSNorm<head_dim, eps>) applied to each query and key head before
// RoPE (Qwen3's q_norm, k_norm); void: none.
// FusedAttention<D, Heads, QKV, O>: one fused q|k|v projection (GPT-2's c_attn).
#include "../ops/attention.hpp"
#include "layer.hpp"
#include "tensor_parallel.hpp"

namespace headroom {

enum class Positions : std::uint8_t { none, rope };

namespace detail {

// The attention core: (q, k, v) -> o, saving q, k, v, o and lse.
template <std::int64_t Heads, std::int64_t KVHeads, std::int64_t HeadDim, Positions Pos, std::int64_t Theta = 10000,
          math::RopeScalingConfig Scaling = math::RopeScalingConfig{}, std::int64_t Window = 0>
struct AttentionCore {
  static constexpr std::string_view kind = "CausalAttention";
  static constexpr std::int64_t in_features = (Heads + 2 * KVHeads) * HeadDim;
  static constexpr std::int64_t out_features = Heads * HeadDim;
  using children = type_list<>;
  using ops = type_list<headroom::ops::Attention>;

  // inputs: either one fused (N, (H + 2 KV) hd) tensor or q (N, H hd), k, v (N, KV hd);
  // with tensor parallelism, this rank's heads (H / N, KV / N)
  static constexpr Ref build_from(graph::Builder& b, const Ref* in, int n_in) {
    return headroom::ops::Attention::emit(b, in, n_in, tensor_parallel::local(b, Heads), tensor_parallel::local(b, KVHeads),
                                          HeadDim, Pos == Positions::rope ? Theta : 0, Scaling.value(), Window);  // o: (N, H hd)
  }
};

template <std::int64_t D, std::int64_t Heads, std::int64_t KVHeads>
constexpr bool attention_dims_ok = Heads > 0 && KVHeads > 0 && D % Heads == 0 && Heads % KVHeads == 0;

}  // namespace detail

// What sets a separate-projection Attention apart beyond its dims.
struct AttentionOptions {
  std::int64_t rope_theta = 10000;          // RoPE base (rope_theta in config.json)
  math::RopeScalingConfig rope_scaling{};   // Llama 3.1's (rope_scaling with rope_type "llama3"); off by default
  std::int64_t head_dim = 0;                // a head's width; 0: D / Heads
  std::int64_t window = 0;                  // sliding window (sliding_window); 0: every earlier position
};

template <std::int64_t D, std::int64_t Heads, std::int64_t KVHeads, Positions Pos, class Q, class K, class V, class O,
          AttentionOptions Options = AttentionOptions{}, class QKNorm = void>
struct Attention {
  HEADROOM_REQUIRE(Heads > 0 && (Options.head_dim > 0 || D % Heads == 0),
                   "Attention<D, Heads, ...>: the number of heads ({}) must divide the model width D ({})", Heads, D);
  HEADROOM_REQUIRE(KVHeads > 0 && Heads % KVHeads == 0,
                   "Attention<D, Heads, KVHeads, ...>: KV heads ({}) must divide the number of heads ({}) (GQA)", KVHeads, Heads);
  static constexpr std::int64_t head_dim = Options.head_dim > 0 ? Options.head_dim : Heads > 0 ? D / Heads : 0;
  HEADROOM_REQUIRE(Pos != Positions::rope || head_dim % 2 == 0,
                   "Attention: RoPE rotates pairs of a head's values, but the head width ({}) is odd", head_dim);
  HEADROOM_REQUIRE(Options.window >= 0, "Attention: the sliding window ({}) must be positive, or 0 for none", Options.window);
  HEADROOM_REQUIRE(Q::in_features == D && Q::out_features == Heads * head_dim,
                   "Attention: q_proj must map D to Heads * head_dim ({} to {}); it maps {} to {}", D, Heads * head_dim,
                   Q::in_features, Q::out_features);
  HEADROOM_REQUIRE(K::in_features == D && K::out_features == KVHeads * head_dim,
                   "Attention: k_proj must map D to KVHeads * head_dim ({} to {}); it maps {} to {}", D, KVHeads * head_dim,
                   K::in_features, K::out_features);
  HEADROOM_REQUIRE(V::in_features == D && V::out_features == KVHeads * head_dim,
                   "Attention: v_proj must map D to KVHeads * head_dim ({} to {}); it maps {} to {}", D, KVHeads * head_dim,
                   V::in_features, V::out_features);
  HEADROOM_REQUIRE(O::in_features == Heads * head_dim && O::out_features == D,
                   "Attention: o_proj must map Heads * head_dim to D ({} to {}); it maps {} to {}", Heads * head_dim, D,
                   O::in_features, O::out_features);
  static constexpr bool qk_norm = !std::is_void_v<QKNorm>;
  static constexpr std::int64_t norm_features = [] {
    if constexpr (qk_norm) return QKNorm::in_features;
    else return head_dim;
  }();
  HEADROOM_REQUIRE(norm_features == head_dim,
                   "Attention: q_norm and k_norm normalize one head of {} values, but the norm given takes {}", head_dim,
                   norm_features);
  static constexpr std::string_view kind = "Attention";
  static constexpr std::int64_t in_features = D, out_features = D;
  static constexpr std::int64_t heads = Heads, kv_heads = KVHeads;
  static constexpr Positions positions = Pos;
  using children = std::conditional_t<qk_norm, type_list<Q, K, V, O, QKNorm>, type_list<Q, K, V, O>>;
  using ops = type_list<headroom::ops::Attention>;  // its core's
  static constexpr std::int64_t rope_theta = Options.rope_theta;
  static constexpr math::RopeScaling rope_scaling = Options.rope_scaling.value();
  static constexpr std::int64_t window = Options.window;
  using core = detail::AttentionCore<Heads, KVHeads, head_dim, Pos, Options.rope_theta, Options.rope_scaling, Options.window>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    x = tensor_parallel::input(b, x, D);
    Ref qkv[3] = {tensor_parallel::column_parallel<Q>(b, "q_proj", x), tensor_parallel::column_parallel<K>(b, "k_proj", x),
                  tensor_parallel::column_parallel<V>(b, "v_proj", x)};  // q: (N, H hd); k, v: (N, KV hd)
    if constexpr (qk_norm) {  // each head of q and k normalized, before RoPE
      qkv[0] = per_head_norm(b, "q_norm", qkv[0], tensor_parallel::local(b, Heads));
      qkv[1] = per_head_norm(b, "k_norm", qkv[1], tensor_parallel::local(b, KVHeads));
    }
    b.open("attn", core::kind);
    const Ref o = core::build_from(b, qkv, 3);  // o: (N, H hd)
    b.close();
    return tensor_parallel::row_parallel<O>(b, "o_proj", o);
  }

 private:
  static constexpr Ref per_head_norm(graph::Builder& b, std::string_view name, Ref x, std::int64_t heads) {
    b.open(name, QKNorm::kind);
    const Ref y = QKNorm::build_per_head(b, x, heads);
    b.close();
    return y;
  }
};

template <std::int64_t D, std::int64_t Heads, class QKV, class O>
struct FusedAttention {
  HEADROOM_REQUIRE(Heads > 0 && D % Heads == 0,
                   "FusedAttention<D, Heads, ...>: the number of heads ({}) must divide the model width D ({})", Heads, D);
  HEADROOM_REQUIRE(QKV::in_features == D && QKV::out_features == 3 * D,
                   "FusedAttention: c_attn must map D to 3 D ({} to {}); it maps {} to {}", D, 3 * D, QKV::in_features,
                   QKV::out_features);
  HEADROOM_REQUIRE(O::in_features == D && O::out_features == D,
                   "FusedAttention: c_proj must map D to D ({} to {}); it maps {} to {}", D, D, O::in_features,
                   O::out_features);
  static constexpr std::string_view kind = "Attention";
  static constexpr std::int64_t in_features = D, out_features = D;
  static constexpr std::int64_t heads = Heads, kv_heads = Heads;
  static constexpr Positions positions = Positions::none;
  using children = type_list<QKV, O>;
  using ops = type_list<headroom::ops::Attention>;  // its core's
  using core = detail::AttentionCore<Heads, Heads, D / Heads, Positions::none>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    x = tensor_parallel::input(b, x, D);
    const Ref qkv = tensor_parallel::column_parallel<QKV>(b, "c_attn", x, 3);  // qkv: (N, 3 D)
    b.open("attn", core::kind);
    const Ref o = core::build_from(b, &qkv, 1);
    b.close();
    return tensor_parallel::row_parallel<O>(b, "c_proj", o);
  }
};

}  // namespace headroom
