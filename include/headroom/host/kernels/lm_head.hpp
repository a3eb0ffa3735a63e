#pragma once
// The LM head and cross-entropy, fused and chunked: for `chunk` tokens at a
// time, logits (chunk, V) = h W^T in scratch, then per row the log-sum-exp,
// the loss and, in place, dlogits = (softmax - onehot(target)) * grad_scale;
// then dh = dlogits W and dW += dlogits^T h. The (N, V) logits never exist.
// h and W are of a storage type T (host/storage.hpp); the logits, the loss
// and the scratch are C = compute_t<T>. A bf16 run rounds dlogits to bf16
// in place before its two products (as a bf16 product's operand is).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../for_this_cpu.hpp"
#include "../gemm.hpp"
#include "../vector_math.hpp"

namespace headroom::host {

namespace detail {
// The first rows * cols floats of z rounded to H (bf16 or f16), in place: the H rows
// (rows, cols) start where z does. Row r's bf16 values land on half of
// float row r / 2, so after row 0 the rows go in rounds [2^k, 2^(k+1)): a
// round reads only its own rows and writes only rows earlier rounds have
// read; within a row, blocks in order write only bytes already read. Bytes
// move through memcpy (the buffer holds floats, then bf16).
template <class H>
H* narrow_rows_in_place(float* z, std::int64_t rows, std::int64_t cols, int workers) {
  auto* bytes = reinterpret_cast<unsigned char*>(z);
  const auto row = [&](std::int64_t r) {
    constexpr std::int64_t block = 256;
    float in[block];
    H out[block];
    for (std::int64_t c0 = 0; c0 < cols; c0 += block) {
      const std::int64_t m = cols - c0 < block ? cols - c0 : block;
      std::memcpy(in, bytes + (r * cols + c0) * 4, static_cast<std::size_t>(m) * 4);
      narrow_row(in, out, m);
      std::memcpy(bytes + (r * cols + c0) * 2, out, static_cast<std::size_t>(m) * 2);
    }
  };
  if (rows > 0) row(0);
  for (std::int64_t first = 1; first < rows; first *= 2) {
    const std::int64_t last = 2 * first < rows ? 2 * first : rows;
    parallel_for_this_cpu(last - first, workers, [&](std::int64_t i, int) { row(first + i); });
  }
  return reinterpret_cast<H*>(z);
}
}  // namespace detail

// The chunk loop: for each chunk, logits = h W^T into scratch, then
// rows(c0, rows, logits, row_loss) turns them into each row's loss and, in
// place, dlogits; then dh and dW. Returns the summed loss (in row order).
template <class T, class Rows, class C = compute_t<T>>
double lm_head_chunks(const T* h, const T* w, T* dh, bool dh_first, T* dw, bool dw_first, std::int64_t n, std::int64_t d,
                      std::int64_t vocab, std::int64_t chunk, C* scratch, const GemmPanels<C>& ws, int workers, Rows&& rows_of) {
  double total = 0.0;
  C* logits = scratch;                    // (chunk, V)
  C* row_loss = scratch + chunk * vocab;  // (chunk)
  for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
    const std::int64_t rows = c0 + chunk < n ? chunk : n - c0;
    gemm(Trans::no, Trans::yes, rows, vocab, d, C(1), h + c0 * d, d, w, d, C(0), logits, vocab, ws, workers);
    rows_of(c0, rows, logits, row_loss);
    for (std::int64_t r = 0; r < rows; ++r) total += static_cast<double>(row_loss[r]);
    if (dh == nullptr && dw == nullptr) continue;
    const T* dz;  // dlogits (rows, V), as the products read them
    if constexpr (std::is_same_v<T, C>) dz = logits;
    else dz = detail::narrow_rows_in_place<T>(logits, rows, vocab, workers);
    if (dh != nullptr)
      gemm(Trans::no, Trans::no, rows, d, vocab, C(1), dz, vocab, w, d, dh_first ? C(0) : C(1), dh + c0 * d, d, ws, workers);
    if (dw != nullptr)
      gemm(Trans::yes, Trans::no, vocab, d, rows, C(1), dz, vocab, h + c0 * d, d, (dw_first && c0 == 0) ? C(0) : C(1), dw, d,
           ws, workers);
  }
  return total;
}

// h (N, D), w (V, D), targets (N), scratch (chunk, V + 2).
// Returns the summed loss over the N tokens (in double, summed in row order).
// grad_scale multiplies dlogits (1 / (N * micro-batches) for a mean loss);
// with dh and dw null only the loss is computed.
template <class T, class C = compute_t<T>>
double lm_head_loss(const T* h, const T* w, const std::int32_t* targets, T* dh, bool dh_first, T* dw, bool dw_first, C grad_scale,
                    std::int64_t n, std::int64_t d, std::int64_t vocab, std::int64_t chunk, C* scratch, const GemmPanels<C>& ws,
                    int workers) {
  const bool grads = dh != nullptr || dw != nullptr;
  return lm_head_chunks(h, w, dh, dh_first, dw, dw_first, n, d, vocab, chunk, scratch, ws, workers,
                        [&](std::int64_t c0, std::int64_t rows, C* logits, C* row_loss) {
                          parallel_for_this_cpu(rows, workers, [&](std::int64_t r, int) {
                            row_loss[r] = vec::cross_entropy_row(logits + r * vocab, vocab, targets[c0 + r], grad_scale, grads);
                          });
                        });
}

// Vocabulary-parallel: this rank's w holds rows [first, first + vocab) of
// the whole vocabulary of `ranks` equal blocks. For each chunk, every row's
// max, sum of exponentials (over this rank's logits) and target logit (0
// where another rank holds the target) go to every rank through
// gather(stats, bytes) (in place: `ranks` blocks, this rank's filled), and
// each rank forms the whole row's log-sum-exp from them, in rank order, so
// every rank computes the same loss; dlogits of its own columns follow.
// dh is then this rank's part of the sum over the ranks. Scratch: (chunk, V
// + 2) and (ranks, chunk, 3).
template <class T, class Gather, class C = compute_t<T>>
double lm_head_loss_vocab_parallel(const T* h, const T* w, const std::int32_t* targets, T* dh, bool dh_first, T* dw, bool dw_first,
                                   C grad_scale, std::int64_t n, std::int64_t d, std::int64_t vocab, std::int64_t chunk,
                                   std::int64_t first, int rank, int ranks, C* scratch, const GemmPanels<C>& ws, int workers,
                                   Gather&& gather) {
  const bool grads = dh != nullptr || dw != nullptr;
  C* stats = scratch + chunk * (vocab + 2);  // (ranks, chunk, 3): max, sum of exponentials, target logit
  return lm_head_chunks(h, w, dh, dh_first, dw, dw_first, n, d, vocab, chunk, scratch, ws, workers,
                        [&](std::int64_t c0, std::int64_t rows, C* logits, C* row_loss) {
                          C* own = stats + static_cast<std::int64_t>(rank) * chunk * 3;
                          parallel_for_this_cpu(rows, workers, [&](std::int64_t r, int) {
                            const C* z = logits + r * vocab;
                            const std::int64_t t = static_cast<std::int64_t>(targets[c0 + r]) - first;
                            own[3 * r] = vec::row_max(z, vocab);
                            own[3 * r + 1] = vec::sum_exp(z, vocab, own[3 * r]);
                            own[3 * r + 2] = t >= 0 && t < vocab ? z[t] : C(0);
                          });
                          gather(stats, chunk * 3 * static_cast<std::int64_t>(sizeof(C)));
                          parallel_for_this_cpu(rows, workers, [&](std::int64_t r, int) {
                            C m = stats[3 * r], target = C(0), s = C(0);
                            for (int q = 1; q < ranks; ++q) m = std::max(m, stats[(q * chunk + r) * 3]);
                            for (int q = 0; q < ranks; ++q) {
                              const C* st = stats + (q * chunk + r) * 3;
                              s += st[1] * std::exp(st[0] - m);
                              target += st[2];
                            }
                            const C lse = m + std::log(s);
                            row_loss[r] = lse - target;
                            if (!grads) return;
                            C* z = logits + r * vocab;
                            vec::exp_scaled(z, vocab, lse, grad_scale);
                            const std::int64_t t = static_cast<std::int64_t>(targets[c0 + r]) - first;
                            if (t >= 0 && t < vocab) z[t] -= grad_scale;
                          });
                        });
}

}  // namespace headroom::host
