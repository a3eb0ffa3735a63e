#ifndef HEADROOM_OPS_ATTENTION_HPP
#define HEADROOM_OPS_ATTENTION_HPP
// Causal self-attention, flash style: forward keeps one log-sum-exp per
// (sequence, head, position) instead of the T x T probabilities; backward
// recomputes the scores tile by tile (Dao et al. 2022, FlashAttention-2).
// With a sliding window W (Mistral; 0: none) position i attends to positions
// i - W + 1 .. i only, and the kernels skip the key tiles outside it.
// RoPE (Su et al. 2021) is applied to q and k as tiles are loaded; GQA shares
// each K/V head among heads / kv_heads query heads. Inputs: q (N, H hd),
// k and v (N, KV hd), or one fused (N, (H + 2 KV) hd) q|k|v tensor.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "../host/op_context.hpp"
#include "../math/rope.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/attention.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::host {
struct AttentionDims;
}

namespace headroom::ops {

struct Attention {
  static constexpr std::string_view name = "attention";
  static constexpr In<0> q{};          // (N, H hd), or the fused (N, (H + 2 KV) hd) q|k|v
  static constexpr In<1> k{};          // (N, KV hd); unbound when fused
  static constexpr In<2> v{};          // (N, KV hd); unbound when fused
  static constexpr Out<0> o{};         // (N, H hd)
  static constexpr Out<1> lse{};       // (B, H, T) in the compute type (CUDA: f32)
  // saved: q, k, v, o, lse; with the fused input: q|k|v, o, lse
  static constexpr Saved<0> q_saved{};
  static constexpr Saved<1> k_saved{};  // fused: o
  static constexpr Saved<2> v_saved{};  // fused: lse
  static constexpr Saved<3> o_saved{};  // unbound when fused
  static constexpr Saved<4> lse_saved{};
  static constexpr Dim<0> heads{};
  static constexpr Dim<1> kv_heads{};
  static constexpr Dim<2> head_dim{};
  static constexpr Dim<3> rope_theta{};  // 0: no RoPE
  // Llama 3.1's RoPE scaling (math::RopeScaling; rope_original 0: none), the
  // factors as the bits of their doubles
  static constexpr Dim<4> rope_factor{};
  static constexpr Dim<5> rope_low_freq_factor{};
  static constexpr Dim<6> rope_high_freq_factor{};
  static constexpr Dim<7> rope_original{};
  static constexpr Dim<8> window{};  // sliding window: position i attends to i - window + 1 .. i; 0: to 0 .. i
  static constexpr std::int64_t tile = 64;

  // `in` holds q, k, v (n_in = 3) or the fused q|k|v (n_in = 1);
  // sliding_window: the window in positions (0: none).
  static constexpr graph::Ref emit(graph::Builder& b, const graph::Ref* in, int n_in, std::int64_t h, std::int64_t kvh,
                                   std::int64_t hd, std::int64_t theta, math::RopeScaling scaling = {},
                                   std::int64_t sliding_window = 0) {
    const std::int64_t B = b.cfg.batch, T = b.cfg.seq, W = b.cfg.workers, cb = b.cfg.compute_bytes();
    graph::Op op = make<Attention>();
    op.set(heads, h);
    op.set(kv_heads, kvh);
    op.set(head_dim, hd);
    op.set(rope_theta, theta);
    op.set(rope_factor, std::bit_cast<std::int64_t>(scaling.factor));
    op.set(rope_low_freq_factor, std::bit_cast<std::int64_t>(scaling.low_freq_factor));
    op.set(rope_high_freq_factor, std::bit_cast<std::int64_t>(scaling.high_freq_factor));
    op.set(rope_original, scaling.original_positions);
    op.set(window, sliding_window);
    op.input(q, in[0]);
    op.save(q_saved, in[0]);
    if (n_in == 3) {
      op.input(k, in[1]);
      op.input(v, in[2]);
      op.save(k_saved, in[1]);
      op.save(v_saved, in[2]);
    }
    const graph::Ref out = b.activation("o", h * hd);        // (N, H hd)
    const graph::Ref stats = b.produced("lse", B * h * T * cb);  // (B, H, T)
    op.output(o, out);
    op.output(lse, stats);
    op.saved[op.n_saved++] = out;    // o_saved (separate) or k_saved (fused)
    op.saved[op.n_saved++] = stats;  // lse_saved (separate) or v_saved (fused)
    if (b.cfg.cuda()) {
      // CUDA: RoPE is computed as tiles load; backward keeps only
      // delta = rowsum(dO * O): (B, H, T) f32
      op.scratch_bwd = B * h * T * 4;
    } else {
      // a RoPE cos/sin table (T, hd); per worker: a (t, t) score tile, rotated
      // q and k tiles and an (t, hd) accumulator, row max and sum
      op.scratch_fwd = (T * hd + W * (tile * tile + 3 * tile * hd + 2 * tile)) * cb;
      // delta = rowsum(dO * O): (B, H, T); the RoPE table; per worker: score
      // and dscore tiles, rotated q / k tiles, dq / dK / dV accumulators; a
      // 16-bit run adds, per worker, an dO tile
      // and the f32 dq of one work item's heads (h / kvh, T, hd)
      op.scratch_bwd = (B * h * T + T * hd + W * (2 * tile * tile + 5 * tile * hd + 2 * tile)) * cb;
      if (is_half(b.cfg.dtype)) op.scratch_bwd += W * (tile * hd + h / kvh * T * hd) * cb;
    }
    // causal: half of QK^T and PV; backward is 2.5x forward (5 matmuls vs 2).
    // Query i attends to min(i + 1, reach) keys: sum_i min(i + 1, reach) ~
    // (T^2 - (T - reach)^2) / 2 pairs, T^2 / 2 without a window (reach = T)
    // and ~ T reach for a window much shorter than T.
    const std::int64_t reach = sliding_window > 0 && sliding_window < T ? sliding_window : T;
    const std::int64_t area = T * T - (T - reach) * (T - reach);  // twice the (query, key) pairs
    op.flops_fwd = 2 * B * h * area * hd;
    op.flops_bwd = 5 * B * h * area * hd;
    if (theta > 0) op.flops_fwd += 3 * B * T * (h + kvh) * hd;
    b.emit(op);
    return out;
  }

  // The three operands' pointers and leading dimensions, separate or fused.
  template <class P>
  struct Qkv {
    P* q;
    P* k;
    P* v;
    std::int64_t ldq, ldk;
  };
  template <class P>
  static Qkv<P> split(P* first, P* second, P* third, std::int64_t q_cols, std::int64_t kv_cols) {
    if (second != nullptr) return {first, second, third, q_cols, kv_cols};
    const std::int64_t ld = q_cols + 2 * kv_cols;
    return {first, first + q_cols, first + q_cols + kv_cols, ld, ld};
  }

  // The backward overwrites its inputs' gradients: a plan that would have it
  // accumulate into one (an input also read by another op) is refused.
  static void check_overwrites(const auto& c) {
    if ((c.grad(q) != nullptr && !c.first(q)) || (c.grad(k) != nullptr && !c.first(k)) || (c.grad(v) != nullptr && !c.first(v)))
      throw std::logic_error("ops::Attention: the plan accumulates into the gradient of an input, which the attention backward "
                             "overwrites (an input of attention read by another op as well)");
  }

  // ---- host ----------------------------------------------------------------------------------------------
  template <class T>
  static host::AttentionDims dims(const host::OpContext<T>& c);
  template <class T>
  static void forward(const host::OpContext<T>& c);
  template <class T>
  static void backward(const host::OpContext<T>& c);
  // The RoPE scaling the op was emitted with.
  template <class Context>
  static math::RopeScaling scaling(const Context& c) {
    return {std::bit_cast<double>(c[rope_factor]), std::bit_cast<double>(c[rope_low_freq_factor]),
            std::bit_cast<double>(c[rope_high_freq_factor]), c[rope_original]};
  }
  // Decode: the rows are one new token per sequence at c.position(); the
  // state is the KV cache, keys then values, each (batch, KV, context, hd).
  // Scratch: the decode row per worker, then dense copies of a fused q|k|v.
  static constexpr std::int64_t decode_scratch(std::int64_t h, std::int64_t kvh, std::int64_t hd, std::int64_t context,
                                               std::int64_t batch, int workers) {
    return workers * (context + 2 * hd) + batch * (h + 2 * kvh) * hd;
  }
  template <class T>
  static void decode(const host::OpContext<T>& c);

  // ---- CUDA ----------------------------------------------------------------------------------------------
#if HEADROOM_CUDA_KERNELS
  template <class S>
  static cuda::AttentionShape shape(const cuda::OpContext<S>& c) {
    return cuda::AttentionShape{c.batch(), c.seq(), c[heads], c[kv_heads], c[head_dim], c[rope_theta] > 0,
                                static_cast<float>(c[rope_theta] > 0 ? c[rope_theta] : 10000), scaling(c), c[window]};
  }
  template <class S>
  static void forward(const cuda::OpContext<S>& c) {
    const cuda::AttentionShape d = shape(c);
    const auto in = split<const S>(c[q], c[k], c[v], d.heads * d.head_dim, d.kv_heads * d.head_dim);
    cuda::attention_forward<S>(d, in.q, in.ldq, in.k, in.ldk, in.v, in.ldk, c[o], c.template get<float>(lse), c.stream());
  }
  template <class S>
  static void backward(const cuda::OpContext<S>& c) {
    check_overwrites(c);
    const cuda::AttentionShape d = shape(c);
    const std::int64_t q_cols = d.heads * d.head_dim, kv_cols = d.kv_heads * d.head_dim;
    const bool separate = c[o_saved] != nullptr;
    const auto in = split<const S>(c[q_saved], separate ? c[k_saved] : nullptr, c[v_saved], q_cols, kv_cols);
    const auto din = split(c.grad(q), separate ? c.grad(k) : nullptr, c.grad(v), q_cols, kv_cols);
    const S* out = separate ? c[o_saved] : c[k_saved];
    const float* stats = separate ? c.template get<float>(lse_saved) : c.template get<float>(v_saved);
    cuda::attention_backward<S>(d, in.q, in.ldq, in.k, in.ldk, in.v, in.ldk, out, stats, c.grad(o), din.q, din.ldq, din.k, din.ldk,
                                din.v, din.ldk, c.template scratch<float>(), c.stream());
  }
#endif
};

}  // namespace headroom::ops
#endif  // HEADROOM_OPS_ATTENTION_HPP

// ---- the host kernels --------------------------------------------------------------------------------------
// Compiled where the host engine is (train/host/trainer.hpp includes
// ops/host_kernels.hpp, which sets HEADROOM_HOST_KERNELS and includes this
// header again): they need Eigen, which a plan alone does not.
#if defined(HEADROOM_HOST_KERNELS) && !defined(HEADROOM_OPS_ATTENTION_HOST_KERNELS)
#define HEADROOM_OPS_ATTENTION_HOST_KERNELS
#include "../host/attention.hpp"

namespace headroom::ops {

// ---- host ----------------------------------------------------------------------------------------------
template <class T>
host::AttentionDims Attention::dims(const host::OpContext<T>& c) {
  return host::AttentionDims{c.batch(), c.seq(), c[heads], c[kv_heads], c[head_dim], c[rope_theta] > 0,
                             static_cast<double>(c[rope_theta] > 0 ? c[rope_theta] : 10000), scaling(c), c[window]};
}
template <class T>
void Attention::forward(const host::OpContext<T>& c) {
  const host::AttentionDims d = dims(c);
  using C = typename host::OpContext<T>::compute;
  const auto in = split(c[q], c[k], c[v], d.heads * d.head_dim, d.kv_heads * d.head_dim);
  host::attention_forward(d, in.q, in.ldq, in.k, in.ldk, in.v, in.ldk, c[o], c.template get<C>(lse), c.template scratch<C>(),
                          c.workers());
}
template <class T>
void Attention::backward(const host::OpContext<T>& c) {
  check_overwrites(c);
  const host::AttentionDims d = dims(c);
  const std::int64_t q_cols = d.heads * d.head_dim, kv_cols = d.kv_heads * d.head_dim;
  const bool separate = c[o_saved] != nullptr;
  const auto in = split(c[q_saved], separate ? c[k_saved] : nullptr, c[v_saved], q_cols, kv_cols);
  const auto din = split(c.grad(q), separate ? c.grad(k) : nullptr, c.grad(v), q_cols, kv_cols);
  using C = typename host::OpContext<T>::compute;
  T* out = separate ? c[o_saved] : c[k_saved];
  C* stats = separate ? c.template get<C>(lse_saved) : c.template get<C>(v_saved);
  host::attention_backward(d, in.q, in.ldq, in.k, in.ldk, in.v, in.ldk, out, stats, c.grad(o), din.q, din.ldq, din.k, din.ldk,
                           din.v, din.ldk, c.template scratch<C>(), c.workers());
}
// Decode: the rows are one new token per sequence at c.position(); the
// state is the KV cache, keys then values, each (batch, KV, context, hd).
template <class T>
void Attention::decode(const host::OpContext<T>& c) {
  host::AttentionDims d = dims(c);
  d.seq = 1;
  const std::int64_t qc = d.heads * d.head_dim, kc = d.kv_heads * d.head_dim, batch = c.rows();
  T* kcache = c.template state<T>();
  T* vcache = kcache + kc * c.context() * batch;
  T* s = c.scratch();
  const T *qr = c[q], *kr = c[k], *vr = c[v];
  if (kr == nullptr) {  // fused q|k|v rows: copy into dense rows first
    const T* qkv = c[q];
    T* dq = s + c.workers() * (c.context() + 2 * d.head_dim);
    T* dk = dq + batch * qc;
    T* dv = dk + batch * kc;
    for (std::int64_t r = 0; r < batch; ++r) {
      const T* row = qkv + r * (qc + 2 * kc);
      std::copy(row, row + qc, dq + r * qc);
      std::copy(row + qc, row + qc + kc, dk + r * kc);
      std::copy(row + qc + kc, row + qc + 2 * kc, dv + r * kc);
    }
    qr = dq;
    kr = dk;
    vr = dv;
  }
  host::attention_decode(d, c.context(), c.position(), qr, kr, vr, kcache, vcache, c[o], s, c.workers());
}

}  // namespace headroom::ops
#endif
