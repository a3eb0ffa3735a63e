#pragma once
// Row-wise and element-wise ops on the host: RMSNorm / LayerNorm (saving
// their row statistics), GELU, SwiGLU, the residual add, the token embedding
// and learned positions. The per-element math is math/*.hpp, shared with CUDA.
// Every kernel takes its tensors in a storage type T (float, double or bf16:
// host/storage.hpp) and computes in compute_t<T> (C below): row statistics
// are C, each stored element is rounded once.
#include <climits>
#include <cstdint>

#include "../../math/activations.hpp"
#include "../../math/norms.hpp"
#include "../for_this_cpu.hpp"
#include "../parallel.hpp"
#include "../storage.hpp"
#include "../vector_math.hpp"

namespace headroom::host {

inline constexpr double norm_eps = math::norm_eps;  // the norms' default epsilon (math/norms.hpp)

// x (N, D) -> h (N, D), rstd (N) [, mean (N) for LayerNorm: bias b may be given]; eps
// as the model's config gives it (rms_norm_eps, layer_norm_epsilon)
template <class T, class C = compute_t<T>>
void norm_forward(bool layer, const T* x, const T* w, const T* b, T* h, C* mean, C* rstd, std::int64_t n, std::int64_t d,
                  int workers, double eps = norm_eps) {
  parallel_for_this_cpu(n, workers, [&](std::int64_t r, int) {
    if (layer) math::layernorm_forward(x + r * d, w, b, static_cast<int>(d), C(eps), h + r * d, mean + r, rstd + r);
    else math::rmsnorm_forward(x + r * d, w, static_cast<int>(d), C(eps), h + r * d, rstd + r);
  });
}

// Column sums over the rows of an (N, D) matrix, each column by one worker:
// sums[j] (+)= sum over r of term(r, j), the rows in order. Workers take
// blocks of `column_block` columns and walk the rows, so every row is read
// contiguously (a column-by-column walk strides D elements per load).
inline constexpr std::int64_t column_block = 256;
template <class T, class Term>
void column_sums(std::int64_t n, std::int64_t d, int workers, T* sums, bool first, Term term) {
  using C = compute_t<T>;
  parallel_for_this_cpu((d + column_block - 1) / column_block, workers, [&](std::int64_t blk, int) {
    const std::int64_t j0 = blk * column_block, cols = j0 + column_block < d ? column_block : d - j0;
    C acc[column_block] = {};
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t j = 0; j < cols; ++j) acc[j] += term(r, j0 + j);
    for (std::int64_t j = 0; j < cols; ++j) sums[j0 + j] = narrow<T>(first ? acc[j] : widen(sums[j0 + j]) + acc[j]);
  });
}

// dx (+)= rows' input gradient; dw / db (+)= column sums (second pass, by
// column blocks, so each is written by one worker).
template <class T, class C = compute_t<T>>
void norm_backward(bool layer, const T* x, const T* w, const C* mean, const C* rstd, const T* dh, T* dx, bool dx_first, T* dw,
                   bool dw_first, T* db, bool db_first, std::int64_t n, std::int64_t d, int workers) {
  if (dx != nullptr)
    parallel_for_this_cpu(n, workers, [&](std::int64_t r, int) {
      if (layer)
        math::layernorm_backward(x + r * d, w, dh + r * d, static_cast<int>(d), mean[r], rstd[r], dx + r * d,
                                 static_cast<T*>(nullptr), static_cast<T*>(nullptr), !dx_first);
      else
        math::rmsnorm_backward(x + r * d, w, dh + r * d, static_cast<int>(d), rstd[r], dx + r * d, static_cast<T*>(nullptr),
                               !dx_first);
    });
  if (dw != nullptr) {
    if (layer)
      column_sums(n, d, workers, dw, dw_first,
                  [&](std::int64_t r, std::int64_t j) { return widen(dh[r * d + j]) * ((widen(x[r * d + j]) - mean[r]) * rstd[r]); });
    else
      column_sums(n, d, workers, dw, dw_first,
                  [&](std::int64_t r, std::int64_t j) { return widen(dh[r * d + j]) * (widen(x[r * d + j]) * rstd[r]); });
  }
  if (db != nullptr) column_sums(n, d, workers, db, db_first, [&](std::int64_t r, std::int64_t j) { return widen(dh[r * d + j]); });
}

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    vec::gelu_rows(x + r.begin, y + r.begin, r.size());
  });
}
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, bool dx_first, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    vec::gelu_backward_rows(x + r.begin, dy + r.begin, dx + r.begin, dx_first, r.size());
  });
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    vec::swiglu_rows(gate + r.begin, up + r.begin, y + r.begin, r.size());
  });
}
template <class T>
void swiglu_backward(const T* gate, const T* up, const T* dy, T* dgate, bool dgate_first, T* dup, bool dup_first,
                     std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    vec::swiglu_backward_rows(gate + r.begin, up + r.begin, dy + r.begin, dgate == nullptr ? nullptr : dgate + r.begin,
                              dgate_first, dup == nullptr ? nullptr : dup + r.begin, dup_first, r.size());
  });
}

// An elementwise op from its element math alone (a user op's kernels):
// F::forward(x) and F::backward(x, dy) -> dx, HEADROOM_HOST_DEVICE, on the
// compute type. y = F(x);  dx (+)= F'(x) dy.
template <class F, class T>
void map_forward(const T* x, T* y, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) y[i] = narrow<T>(F::forward(widen(x[i])));
  });
}
template <class F, class T>
void map_backward(const T* x, const T* dy, T* dx, bool dx_first, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) {
      const compute_t<T> g = F::backward(widen(x[i]), widen(dy[i]));
      dx[i] = narrow<T>(dx_first ? g : widen(dx[i]) + g);
    }
  });
}

// y = x + f; backward adds dy into whichever input gradient is a buffer of
// its own (the residual stream usually *is* dy, and then there is nothing to do).
template <class T>
void add_forward(const T* x, const T* f, T* y, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) y[i] = narrow<T>(widen(x[i]) + widen(f[i]));
  });
}
template <class T>
void accumulate(const T* dy, T* dx, bool dx_first, std::int64_t count, int workers) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range r = share(count, c, w);
    for (std::int64_t i = r.begin; i < r.end; ++i) dx[i] = dx_first ? dy[i] : narrow<T>(widen(dx[i]) + widen(dy[i]));
  });
}

// x (N, D) = E[tokens] ; dE (+)= scatter of dx rows (by columns: one writer each).
// A table of rows [first, first + vocab) of the vocabulary (a rank's block
// with tensor parallelism; the whole by default): tokens outside it give
// zero rows and no gradient.
template <class T>
void embedding_forward(const std::int32_t* tokens, const T* table, T* x, std::int64_t n, std::int64_t d, int workers,
                       std::int64_t first = 0, std::int64_t vocab = INT64_MAX) {
  parallel_for_this_cpu(n, workers, [&](std::int64_t r, int) {
    const std::int64_t t = static_cast<std::int64_t>(tokens[r]) - first;
    if (t < 0 || t >= vocab) {
      for (std::int64_t j = 0; j < d; ++j) x[r * d + j] = T{};
      return;
    }
    const T* src = table + t * d;
    for (std::int64_t j = 0; j < d; ++j) x[r * d + j] = src[j];
  });
}
template <class T>
void embedding_backward(const std::int32_t* tokens, const T* dx, T* dtable, bool first, std::int64_t n, std::int64_t vocab,
                        std::int64_t d, int workers, std::int64_t first_row = 0) {
  team_for_this_cpu(workers, [&](int w, int c) {
    const Range cols = share(d, c, w);
    if (first)
      for (std::int64_t v = 0; v < vocab; ++v)
        for (std::int64_t j = cols.begin; j < cols.end; ++j) dtable[v * d + j] = T{};
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t t = static_cast<std::int64_t>(tokens[r]) - first_row;
      if (t < 0 || t >= vocab) continue;
      T* dst = dtable + t * d;
      for (std::int64_t j = cols.begin; j < cols.end; ++j) dst[j] = narrow<T>(widen(dst[j]) + widen(dx[r * d + j]));
    }
  });
}

// x (B*T, D) += P[t] ; dP[t] (+)= sum over the batch of dx[b, t]
template <class T>
void positions_forward(const T* table, T* x, std::int64_t batch, std::int64_t seq, std::int64_t d, int workers) {
  parallel_for_this_cpu(batch * seq, workers, [&](std::int64_t r, int) {
    const T* p = table + (r % seq) * d;
    for (std::int64_t j = 0; j < d; ++j) x[r * d + j] = narrow<T>(widen(x[r * d + j]) + widen(p[j]));
  });
}
// (rows of P past seq get no gradient: zero when this writes dP first)
template <class T>
void positions_backward(const T* dx, T* dtable, bool first, std::int64_t batch, std::int64_t seq, std::int64_t max_pos,
                        std::int64_t d, int workers) {
  parallel_for_this_cpu(max_pos, workers, [&](std::int64_t t, int) {
    for (std::int64_t j = 0; j < d; ++j) {
      if (t >= seq) {
        if (first) dtable[t * d + j] = T{};
        continue;
      }
      compute_t<T> s = 0;
      for (std::int64_t b = 0; b < batch; ++b) s += widen(dx[(b * seq + t) * d + j]);
      dtable[t * d + j] = narrow<T>(first ? s : widen(dtable[t * d + j]) + s);
    }
  });
}

}  // namespace headroom::host
