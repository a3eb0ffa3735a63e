#pragma once
// The LM head and cross-entropy, fused and chunked: for `chunk` tokens at a
// time, logits (chunk, V) = h W^T in scratch, then per row the log-sum-exp,
// the loss and, in place, dlogits = (softmax - onehot(target)) * grad_scale;
// then dh = dlogits W and dW += dlogits^T h. The (N, V) logits never exist.
#include <cmath>
#include <cstdint>

#include "../gemm.hpp"
#include "../vector_math.hpp"

namespace headroom::host {

// h (N, D), w (V, D), targets (N), scratch (chunk, V + 2).
// Returns the summed loss over the N tokens (in double, summed in row order).
// grad_scale multiplies dlogits (1 / (N * micro-batches) for a mean loss);
// with dh and dw null only the loss is computed.
template <class T>
double lm_head_loss(const T* h, const T* w, const std::int32_t* targets, T* dh, bool dh_first, T* dw, bool dw_first, T grad_scale,
                    std::int64_t n, std::int64_t d, std::int64_t vocab, std::int64_t chunk, T* scratch, const GemmPanels<T>& ws,
                    int workers) {
  const bool grads = dh != nullptr || dw != nullptr;
  double total = 0.0;
  T* logits = scratch;                    // (chunk, V)
  T* row_loss = scratch + chunk * vocab;  // (chunk)
  for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::int64_t rows = c0 + chunk < n ? chunk : n - c0;
    gemm(Trans::no, Trans::yes, rows, vocab, d, T(1), h + c0 * d, d, w, d, T(0), logits, vocab, ws, workers);
    parallel_for(rows, workers, [&](std::int64_t r, int) {
      row_loss[r] = vec::cross_entropy_row(logits + r * vocab, vocab, targets[c0 + r], grad_scale, grads);
    });
    for (std::int64_t r = 0; r < rows; ++r) total += static_cast<double>(row_loss[r]);
    if (dh != nullptr)
      gemm(Trans::no, Trans::no, rows, d, vocab, T(1), logits, vocab, w, d, dh_first ? T(0) : T(1), dh + c0 * d, d, ws, workers);
    if (dw != nullptr)
      gemm(Trans::yes, Trans::no, vocab, d, rows, T(1), logits, vocab, h + c0 * d, d, (dw_first && c0 == 0) ? T(0) : T(1), dw, d,
           ws, workers);
  }
  return total;
}

}  // namespace headroom::host
