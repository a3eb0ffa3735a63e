#pragma once
// LMHeadLoss<Vocab, D, Tied>: logits = h W^T, loss = mean cross-entropy,
// fused and chunked: tokens are processed `loss_chunk` at a time, each chunk's
// logits (chunk, Vocab) f32 exist only in scratch and are turned into
// dlogits, dH and dW in the same pass, so the (N, Vocab) logits never exist
// whole and backward has nothing left to do (the loss event writes the
// gradients). Tied: W is the embedding table.
#include "layer.hpp"

namespace headroom {

template <std::int64_t Vocab, std::int64_t D, bool Tied>
struct LMHeadLoss {
  HEADROOM_REQUIRE(Vocab > 0 && D > 0, "LMHeadLoss<Vocab, D, Tied>: dims must be positive (they are {} and {})", Vocab, D);
  static constexpr std::string_view kind = "LMHeadLoss";
  static constexpr std::int64_t in_features = D, out_features = 0;
  static constexpr bool tied = Tied;
  using children = type_list<>;

  static constexpr Ref build(graph::Builder& b, Ref h) {  // h: (N, D)
    int w = b.tied_weight;
    if constexpr (!Tied) w = b.matrix("weight", Vocab, D);  // W: (Vocab, D)
    const graph::Param pw = b.params[w];
    const std::int64_t n = b.tokens_count();
    const std::int64_t chunk = b.cfg.loss_chunk < n ? b.cfg.loss_chunk : n;
    Op op{};
    op.kind = graph::OpKind::lm_head_loss;
    op.param[0] = w;
    op.dim[0] = Vocab;
    op.dim[1] = D;
    op.dim[2] = chunk;
    op.in[0] = h;
    op.in_grad[0] = true;
    op.in[1] = b.targets;
    op.n_in = 2;
    const Ref loss = b.produced("loss", b.cfg.compute_bytes());  // f32 scalar
    b.tensors[loss.id].role = Role::batch_io;
    b.loss = loss;
    op.out[0] = loss;
    op.n_out = 1;
    op.fused_loss = true;
    // host: logits / probabilities of one chunk, f32: (chunk, Vocab), plus row max and sum;
    // CUDA: the logits of one chunk in the storage type, (chunk, ld) with ld =
    // Vocab rounded up to 64 so cuBLASLt keeps its fast kernels (turned into
    // dlogits in place; the padding columns are never read), then every
    // token's loss in f32 (summed once, in order, at the end)
    op.scratch_fwd = b.cfg.cuda() ? CudaWorkspace::lm_head_logits_bytes(chunk, Vocab, b.cfg.act_bytes()) + n * 4
                                  : chunk * (Vocab + 2) * b.cfg.compute_bytes();
    b.gemm(chunk, Vocab, D);  // logits = h W^T
    b.gemm(chunk, D, Vocab);  // dh = dlogits W
    if (pw.trainable) b.gemm(Vocab, D, chunk);  // dW += dlogits^T h
    op.flops_fwd = 2 * n * D * Vocab;
    op.flops_bwd = 2 * n * D * Vocab;  // dH
    if (pw.trainable) {
      op.grads[op.n_grads++] = pw.grad;
      op.flops_bwd += 2 * n * D * Vocab;  // dW
    }
    b.emit(op, EventKind::loss);
    return loss;
  }
};

}  // namespace headroom
