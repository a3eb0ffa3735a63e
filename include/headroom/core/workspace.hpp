#pragma once
// What the engines' kernels need besides the model's tensors, as constants
// the planner sizes its buffers by and the kernels read: the host GEMM's
// packing panels (GemmBlocking) and the CUDA engine's workspace
// (CudaWorkspace). Kernels include this header, not the planner.
#include <cstdint>

#include "bytes.hpp"

namespace headroom {

// What the CUDA engine's kernels need beyond the model's tensors.
struct CudaWorkspace {
  static constexpr std::int64_t gemm_bytes = std::int64_t{32} << 20;  // one cuBLASLt workspace (32 MiB, NVIDIA's size for Hopper)
  static constexpr std::int64_t reduction_slots = 2048;                // gradient-norm partial sums, f32
  static constexpr std::int64_t control_floats = 16;                   // the update's control block (cuda::UpdateControl)
  static constexpr std::int64_t reduction_bytes = (reduction_slots + control_floats) * 4;
  // The leading dimension of the LM head's logits: the vocabulary rounded up
  // to a multiple of 64 elements (GPT-2's 50,257 -> 50,304, as llm.c pads it),
  // so that cuBLASLt writes and reads them with aligned rows; the columns
  // past the vocabulary are never written or read.
  static constexpr std::int64_t lm_head_logits_ld(std::int64_t vocab) { return align_up(vocab, 64); }
  // The LM head's chunk of logits (chunk, vocab) in the storage type at row
  // stride lm_head_logits_ld(vocab), rounded up so that the per-token f32
  // losses after it in the same scratch are aligned.
  static constexpr std::int64_t lm_head_logits_bytes(std::int64_t chunk, std::int64_t vocab, std::int64_t act_bytes) {
    return align_up(chunk * lm_head_logits_ld(vocab) * act_bytes, 256);
  }
  // Pinned host memory a step reads and writes through (the offload tier):
  // every micro-batch's tokens and targets, the step's hyperparameters and
  // its results (a CUDA graph replays copies from and to fixed addresses).
  static constexpr std::int64_t staging_bytes(std::int64_t tokens_per_step) {
    return 2 * tokens_per_step * 4 + 2 * control_floats * 4;
  }
};

// The GEMM packing panels each worker owns (Goto's algorithm, as Eigen's
// gebp kernel runs it): a (kc, mc) panel of the left operand and a (kc, nc)
// panel of the right one. The host engine hands Eigen these panels from the
// arena, so a GEMM allocates nothing; the plan holds them as one workspace.
struct GemmBlocking {
  static constexpr std::int64_t kc = 256, mc = 192, nc = 1024;
  static constexpr std::int64_t align = 64;  // elements: each panel starts 64-element aligned
  static constexpr std::int64_t round(std::int64_t n) { return (n + align - 1) / align * align; }
  // elements per worker for an (m, n, k) product, either orientation. A
  // 16-bit C (bf16 or f16: half_c) is summed block by block in an (mc, at most nc_bf16_c)
  // float accumulator after the two packed blocks, and rounded once: the
  // panel holds that too (the big products' panels already do, with nc cut
  // to what fits: 576 columns).
  static constexpr std::int64_t nc_bf16_c = 256;
  static constexpr std::int64_t panel_elements(std::int64_t m, std::int64_t n, std::int64_t k, bool half_c = false) {
    const std::int64_t big = m > n ? m : n;
    const std::int64_t kk = k < kc ? k : kc, bm = big < mc ? big : mc, bn = big < nc ? big : nc;
    const std::int64_t plain = round(kk * bm) + round(kk * bn);
    if (!half_c) return plain;
    const std::int64_t bc = big < nc_bf16_c ? big : nc_bf16_c;
    const std::int64_t with_accumulator = round(kk * bm) + round(kk * bc) + bm * bc;
    return plain > with_accumulator ? plain : with_accumulator;
  }
};

}  // namespace headroom
