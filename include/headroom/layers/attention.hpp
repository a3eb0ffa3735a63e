#pragma once
// Causal self-attention, flash style: forward keeps one log-sum-exp (f32; f64 in f64 runs) per
// (sequence, head, position) instead of the T x T probabilities; backward
// recomputes the scores tile by tile (Dao et al. 2022, FlashAttention-2).
// RoPE (Su et al. 2021) is applied to q and k as tiles are loaded, so no
// rotated copy exists; GQA shares each K/V head among Heads / KVHeads query heads.
//
// Attention<D, Heads, KVHeads, Rope, Q, K, V, O>: separate projections (Llama).
// FusedAttention<D, Heads, QKV, O>: one fused q|k|v projection (GPT-2's c_attn).
#include "layer.hpp"

namespace headroom {

enum class Positions : std::uint8_t { none, rope };

namespace detail {

// The attention core: (q, k, v) -> o, saving q, k, v, o and lse.
template <std::int64_t Heads, std::int64_t KVHeads, std::int64_t HeadDim, Positions Pos, std::int64_t Theta = 10000>
struct AttentionCore {
  static constexpr std::string_view kind = "CausalAttention";
  static constexpr std::int64_t in_features = (Heads + 2 * KVHeads) * HeadDim;
  static constexpr std::int64_t out_features = Heads * HeadDim;
  using children = type_list<>;

  // inputs: either one fused (N, (H + 2 KV) hd) tensor or q (N, H hd), k, v (N, KV hd)
  static constexpr Ref build_from(graph::Builder& b, const Ref* in, int n_in) {
    const std::int64_t B = b.cfg.batch, T = b.cfg.seq, W = b.cfg.workers, cb = b.cfg.compute_bytes();
    Op op{};
    op.kind = graph::OpKind::attention;
    op.dim[0] = Heads;
    op.dim[1] = KVHeads;
    op.dim[2] = HeadDim;
    op.dim[3] = Pos == Positions::rope ? Theta : 0;
    for (int i = 0; i < n_in; ++i) {
      op.in[i] = in[i];
      op.in_grad[i] = true;
      op.saved[op.n_saved++] = in[i];
    }
    op.n_in = n_in;
    const Ref o = b.activation("o", Heads * HeadDim);           // o: (N, H hd)
    const Ref lse = b.produced("lse", B * Heads * T * cb);        // lse: (B, H, T) in the compute type
    op.out[0] = o;
    op.out[1] = lse;
    op.n_out = 2;
    op.saved[op.n_saved++] = o;
    op.saved[op.n_saved++] = lse;
    const std::int64_t t = detail::tile;
    if (b.cfg.cuda()) {
      // CUDA: RoPE is computed as tiles load; backward keeps only
      // delta = rowsum(dO * O): (B, H, T) f32
      op.scratch_fwd = 0;
      op.scratch_bwd = B * Heads * T * 4;
    } else {
      // a RoPE cos/sin table (T, hd); per worker: a (t, t) score tile, rotated
      // q and k tiles and an (t, hd) accumulator, row max and sum
      op.scratch_fwd = (T * HeadDim + W * (t * t + 3 * t * HeadDim + 2 * t)) * cb;
      // delta = rowsum(dO * O): (B, H, T); the RoPE table; per worker: score
      // and dscore tiles, rotated q / k tiles, dq / dK / dV accumulators
      op.scratch_bwd = (B * Heads * T + T * HeadDim + W * (2 * t * t + 5 * t * HeadDim + 2 * t)) * cb;
    }
    // causal: half of QK^T and PV; backward is 2.5x forward (5 matmuls vs 2)
    op.flops_fwd = 2 * B * Heads * T * T * HeadDim;
    op.flops_bwd = 5 * B * Heads * T * T * HeadDim;
    if constexpr (Pos == Positions::rope) op.flops_fwd += 3 * B * T * (Heads + KVHeads) * HeadDim;
    b.emit(op);
    return o;
  }
};

template <std::int64_t D, std::int64_t Heads, std::int64_t KVHeads>
constexpr bool attention_dims_ok = Heads > 0 && KVHeads > 0 && D % Heads == 0 && Heads % KVHeads == 0;

}  // namespace detail

template <std::int64_t D, std::int64_t Heads, std::int64_t KVHeads, Positions Pos, class Q, class K, class V, class O,
          std::int64_t RopeTheta = 10000>
struct Attention {
  HEADROOM_REQUIRE(Heads > 0 && D % Heads == 0,
                   "Attention<D, Heads, ...>: the number of heads ({}) must divide the model width D ({})", Heads, D);
  HEADROOM_REQUIRE(KVHeads > 0 && Heads % KVHeads == 0,
                   "Attention<D, Heads, KVHeads, ...>: KV heads ({}) must divide the number of heads ({}) (GQA)", KVHeads, Heads);
  static constexpr std::int64_t head_dim = Heads > 0 ? D / Heads : 0;
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
  static constexpr std::string_view kind = "Attention";
  static constexpr std::int64_t in_features = D, out_features = D;
  static constexpr std::int64_t heads = Heads, kv_heads = KVHeads;
  static constexpr Positions positions = Pos;
  using children = type_list<Q, K, V, O>;
  static constexpr std::int64_t rope_theta = RopeTheta;
  using core = detail::AttentionCore<Heads, KVHeads, D / Heads, Pos, RopeTheta>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const Ref qkv[3] = {b.child<Q>("q_proj", x), b.child<K>("k_proj", x), b.child<V>("v_proj", x)};
    b.open("attn", core::kind);
    const Ref o = core::build_from(b, qkv, 3);  // o: (N, H hd)
    b.close();
    return b.child<O>("o_proj", o);
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
  using core = detail::AttentionCore<Heads, Heads, D / Heads, Positions::none>;

  static constexpr Ref build(graph::Builder& b, Ref x) {  // x: (N, D)
    const Ref qkv = b.child<QKV>("c_attn", x);            // qkv: (N, 3 D)
    b.open("attn", core::kind);
    const Ref o = core::build_from(b, &qkv, 1);
    b.close();
    return b.child<O>("c_proj", o);
  }
};

}  // namespace headroom
