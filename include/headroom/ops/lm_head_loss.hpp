#ifndef HEADROOM_OPS_LM_HEAD_LOSS_HPP
#define HEADROOM_OPS_LM_HEAD_LOSS_HPP
// The fused LM head and cross-entropy: logits = h W^T, loss = mean
// cross-entropy over the tokens, in chunks of `chunk` tokens: each chunk's
// logits exist only in scratch and are turned into dlogits, dh and dW in the
// same pass, so the (N, vocab) logits never exist whole and the backward has
// nothing left to do (the loss event writes the gradients). This op runs as
// the step's loss event: its kernel is loss(k, grads), not forward/backward.
#include <cstdint>
#include <string_view>

#include "../host/op_context.hpp"
#include "op.hpp"
#if HEADROOM_CUDA_KERNELS
#include "../cuda/kernels/loss.cuh"
#include "../cuda/op_context.cuh"
#endif

namespace headroom::ops {

struct LmHeadLoss {
  static constexpr std::string_view name = "lm_head_loss";
  static constexpr In<0> h{};          // (N, D)
  static constexpr In<1> targets{};    // (N) i32
  static constexpr Out<0> result{};    // the loss (a scalar)
  static constexpr Weight<0> weight{};  // (vocab, D), maybe the embedding table (tied)
  static constexpr Dim<0> vocab{};
  static constexpr Dim<1> features{};
  static constexpr Dim<2> chunk{};
  static constexpr Dim<3> ranks{};  // tensor-parallel ranks: vocab is this rank's block of rows (layers/tensor_parallel.hpp)

  // v: the vocabulary rows w holds (this rank's, with tensor parallelism).
  static constexpr graph::Ref emit(graph::Builder& b, graph::Ref input, int w, std::int64_t v, std::int64_t d) {
    const graph::Param pw = b.params[w];
    const std::int64_t n = b.tokens_count();
    const std::int64_t c = b.cfg.loss_chunk < n ? b.cfg.loss_chunk : n;
    graph::Op op = make<LmHeadLoss>();
    op.use(weight, w, pw.trainable ? pw.grad : graph::none);
    op.set(vocab, v);
    op.set(features, d);
    op.set(chunk, c);
    op.set(ranks, b.cfg.tp);
    b.vocab = v * b.cfg.tp;  // the model's vocabulary: what it predicts
    op.input(h, input);
    op.input(targets, b.targets, false);
    const graph::Ref out = b.produced("loss", b.cfg.compute_bytes());  // f32 scalar
    b.tensors[out.id].role = Role::batch_io;
    b.loss = out;
    op.output(result, out);
    op.fused_loss = true;
    // host: logits / probabilities of one chunk in the compute type: (chunk,
    // vocab), plus row max and sum; CUDA: the logits of one chunk in the
    // storage type, (chunk, ld) with ld = vocab rounded up to 64 so cuBLASLt
    // keeps its fast kernels (turned into dlogits in place; the padding
    // columns are never read), then every token's loss in f32 (summed once,
    // in order, at the end)
    // (with tensor parallelism, each row's statistics from every rank, (ranks,
    // chunk, 3) in the compute type, f32 on CUDA)
    const std::int64_t stats = b.cfg.tp > 1 ? b.cfg.tp * c * 3 : 0;
    op.scratch_fwd = b.cfg.cuda() ? CudaWorkspace::lm_head_logits_bytes(c, v, b.cfg.act_bytes()) + n * 4 + stats * 4
                                  : (c * (v + 2) + stats) * b.cfg.compute_bytes();
    b.gemm(c, v, d);                       // logits = h W^T
    b.gemm(c, d, v);                       // dh = dlogits W
    if (pw.trainable) b.gemm(v, d, c);     // dW += dlogits^T h
    if (b.cfg.tp > 1) {  // each chunk's row statistics, gathered from every rank
      const std::int64_t chunks = (n + c - 1) / c;
      op.exchange_fwd = graph::Exchange{.all_gather = chunks * b.cfg.tp * c * 3 * b.cfg.compute_bytes(), .all_gather_calls = chunks};
    }
    op.flops_fwd = 2 * n * d * v;
    op.flops_bwd = 2 * n * d * v;          // dh
    if (pw.trainable) op.flops_bwd += 2 * n * d * v;  // dW
    b.emit(op, EventKind::loss);
    return out;
  }

  // ---- host ----------------------------------------------------------------------------------------------
  // The summed loss of the micro-batch; with `grads`, dh and dW too, scaled
  // by the loss scale / (tokens per optimizer step).
  template <class T>
  static double loss(const host::OpContext<T>& k, bool grads);
  // Decode: the rows' logits (N, vocab) into the state buffer.
  template <class T>
  static void decode(const host::OpContext<T>& k);

#if HEADROOM_CUDA_KERNELS
  // The summed loss goes to the step's loss slot and the control block.
  template <class S>
  static void loss(const cuda::OpContext<S>& k, bool grads) {
    using cuda::Trans;
    const std::int64_t n = k.rows(), v = k[vocab], d = k[features], c = k[chunk];
    const float scale = 1.0f / static_cast<float>(n * k.accumulate());
    // the loss scale, read on the device (a captured step replays with the next one's)
    const float* loss_scale = k.control() != nullptr ? &k.control()->loss_scale : nullptr;
    const S* hs = k[h];
    const S* w = k[weight];
    const std::int32_t* t = k.template get<std::int32_t>(targets);
    S* dh = grads ? k.grad(h) : nullptr;
    S* dw = grads ? k.grad(weight) : nullptr;
    // (chunk, V) at row stride ld = V rounded up to 64 (aligned rows for
    // cuBLASLt); columns [V, ld) are never written or read
    const std::int64_t ld = CudaWorkspace::lm_head_logits_ld(v);
    S* logits = k.template scratch<S>();
    float* row_loss = reinterpret_cast<float*>(reinterpret_cast<std::byte*>(logits) +
                                               CudaWorkspace::lm_head_logits_bytes(c, v, sizeof(S)));  // (N)
    // tensor parallelism: (ranks, chunk, 3) f32 row statistics after the losses
    float* stats = row_loss + n;
    const int group = static_cast<int>(k[ranks]), rank = group > 1 ? k.tensor_comm->rank() : 0;
    const bool gradient = dh != nullptr || dw != nullptr;
    for (std::int64_t c0 = 0; c0 < n; c0 += c) {
      const std::int64_t rows = c0 + c < n ? c : n - c0;
      k.blas().template gemm<S>(Trans::no, Trans::yes, rows, v, d, 1.0f, hs + c0 * d, d, w, d, 0.0f, logits, ld, k.stream());
      if (group > 1)
        cuda::cross_entropy_rows_vocab_parallel<S>(
            logits, t + c0, row_loss + c0, scale, loss_scale, gradient, rows, v, ld, rank * v, stats, c, rank, group,
            [&](float* all) { k.tensor_comm->all_gather(all + rank * c * 3, all, c * 3 * 4, k.stream()); }, k.stream());
      else
        cuda::cross_entropy_rows<S>(logits, t + c0, row_loss + c0, scale, loss_scale, gradient, rows, v, ld, k.stream());
      if (dh != nullptr)
        k.blas().template gemm<S>(Trans::no, Trans::no, rows, d, v, 1.0f, logits, ld, w, d, k.first(h) ? 0.0f : 1.0f, dh + c0 * d, d,
                                  k.stream());
      if (dw != nullptr)
        k.blas().template gemm<S>(Trans::yes, Trans::no, v, d, rows, 1.0f, logits, ld, hs + c0 * d, d,
                                  (k.first(weight) && c0 == 0) ? 0.0f : 1.0f, dw, d, k.stream());
    }
    cuda::sum_rows(row_loss, n, k.loss(), k.stream());
    cuda::finish_loss(k.loss(), scale, k.control(), k.stream());
  }
#endif
};

}  // namespace headroom::ops
#endif  // HEADROOM_OPS_LM_HEAD_LOSS_HPP

// ---- the host kernels --------------------------------------------------------------------------------------
// Compiled where the host engine is (train/host/trainer.hpp includes
// ops/host_kernels.hpp, which sets HEADROOM_HOST_KERNELS and includes this
// header again): they need Eigen, which a plan alone does not.
#if defined(HEADROOM_HOST_KERNELS) && !defined(HEADROOM_OPS_LM_HEAD_LOSS_HOST_KERNELS)
#define HEADROOM_OPS_LM_HEAD_LOSS_HOST_KERNELS
#include "../host/gemm.hpp"
#include "../host/kernels/lm_head.hpp"

namespace headroom::ops {

// ---- host ----------------------------------------------------------------------------------------------
// The summed loss of the micro-batch; with `grads`, dh and dW too, scaled
// by the loss scale / (tokens per optimizer step).
template <class T>
double LmHeadLoss::loss(const host::OpContext<T>& k, bool grads) {
  using C = typename host::OpContext<T>::compute;
  const std::int64_t n = k.rows();
  // 1 / (tokens per step), times the loss scale (a power of two: exact)
  const C scale = static_cast<C>(k.loss_scale) / static_cast<C>(n * k.accumulate());
  if (k[ranks] > 1) {
    const int rank = k.tensor_comm->rank();
    return host::lm_head_loss_vocab_parallel(
        k[h], k[weight], k.template get<std::int32_t>(targets), grads ? k.grad(h) : nullptr, k.first(h), grads ? k.grad(weight) : nullptr,
        k.first(weight), scale, n, k[features], k[vocab], k[chunk], rank * k[vocab], rank, static_cast<int>(k[ranks]), k.template scratch<C>(),
        k.panels(), k.workers(), [&](C* stats, std::int64_t bytes) { k.tensor_comm->all_gather(stats, bytes); });
  }
  return host::lm_head_loss(k[h], k[weight], k.template get<std::int32_t>(targets), grads ? k.grad(h) : nullptr, k.first(h),
                            grads ? k.grad(weight) : nullptr, k.first(weight), scale, n, k[features], k[vocab], k[chunk],
                            k.template scratch<C>(), k.panels(), k.workers());
}
// Decode: the rows' logits (N, vocab) into the state buffer.
template <class T>
void LmHeadLoss::decode(const host::OpContext<T>& k) {
  using C = typename host::OpContext<T>::compute;
  host::gemm(host::Trans::no, host::Trans::yes, k.rows(), k[vocab], k[features], C(1), k[h], k[features], k[weight], k[features],
             C(0), k.template state<T>(), k[vocab], k.panels(), k.workers());
}

}  // namespace headroom::ops
#endif
