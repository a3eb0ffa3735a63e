#pragma once
// Projections on the host: dense, quantized (panel-at-a-time dequantization;
// LLM.int8's decomposed int8 product) and LoRA (low-rank product added into the base output in place).
//
// Conventions of every host kernel: row-major tensors, N = tokens; a
// gradient argument written with `first` = true is overwritten (this event
// creates the buffer), otherwise added to; null means "not wanted". Tensors
// are of a storage type T (host/storage.hpp); products sum in C =
// compute_t<T> and round each element once (host::gemm's bf16 C), and the
// scales and GEMM panels are C.
#include <cstdint>

#include "../../math/activations.hpp"
#include "../../math/dropout.hpp"
#include "../../math/llm_int8.hpp"
#include "../gemm.hpp"
#include "../quant.hpp"
#include "../vector_math.hpp"
#include "pointwise.hpp"

namespace headroom::host {

// What the forward pass does to each output row right after its GEMM panel,
// while it is in cache: add the bias, and optionally apply the activation of
// the op that follows (GELU of the MLP, or SwiGLU once its second input is
// the one being produced), writing the activation's output as well.
enum class Fused : std::uint8_t { none, gelu, swiglu_up };
template <class T>
struct Epilogue {
  const T* bias = nullptr;   // (Out)
  Fused act = Fused::none;
  T* act_out = nullptr;      // (N, Out): gelu(y), or silu(gate) * y
  const T* gate = nullptr;   // (N, Out): swiglu's first input, already computed
};

namespace detail {
template <class T>
void apply_epilogue(const Epilogue<T>& ep, T* y, std::int64_t r0, std::int64_t r1, std::int64_t out) {
  for_this_cpu([&] {
    for (std::int64_t r = r0; r < r1; ++r) {
      T* row = y + r * out;
      if (ep.bias != nullptr)
        for (std::int64_t j = 0; j < out; ++j) row[j] = narrow<T>(widen(row[j]) + widen(ep.bias[j]));
      if (ep.act == Fused::gelu) vec::gelu_rows(row, ep.act_out + r * out, out);
      else if (ep.act == Fused::swiglu_up) vec::swiglu_rows(ep.gate + r * out, row, ep.act_out + r * out, out);
    }
  });
}
inline constexpr std::int64_t epilogue_rows = 64;  // rows per GEMM panel when an epilogue follows
}  // namespace detail

// y (N, Out) = x (N, In) W^T (Out, In), then the epilogue, panel by panel.
template <class T, class C = compute_t<T>>
void linear_forward(const T* x, const T* w, T* y, std::int64_t n, std::int64_t in, std::int64_t out, const Epilogue<T>& ep,
                    const GemmPanels<C>& ws, int workers) {
  const bool has_epilogue = ep.bias != nullptr || ep.act != Fused::none;
  if (!has_epilogue || n < out) {
    gemm(Trans::no, Trans::yes, n, out, in, C(1), x, in, w, in, C(0), y, out, ws, workers);
    if (has_epilogue)
      team(workers, [&](int wk, int count) {
        const Range r = share(n, count, wk);
        detail::apply_epilogue(ep, y, r.begin, r.end, out);
      });
    return;
  }
  team(workers, [&](int wk, int count) {
    const Range r = share(n, count, wk);
    for (std::int64_t r0 = r.begin; r0 < r.end; r0 += detail::epilogue_rows) {
      const std::int64_t r1 = r0 + detail::epilogue_rows < r.end ? r0 + detail::epilogue_rows : r.end;
      gemm_serial(Trans::no, Trans::yes, r1 - r0, out, in, C(1), x + r0 * in, in, w, in, C(0), y + r0 * out, out, ws, wk);
      detail::apply_epilogue(ep, y, r0, r1, out);
    }
  });
}

// Backward of a dense projection: dx (+)= dy W; dW (+)= dy^T x; db (+)= colsum(dy).
template <class T, class C = compute_t<T>>
void linear_backward(const T* dy, const T* x, const T* w, T* dx, bool dx_first, T* dw, bool dw_first, T* db, bool db_first,
                     std::int64_t n, std::int64_t in, std::int64_t out, const GemmPanels<C>& ws, int workers) {
  if (dx != nullptr) gemm(Trans::no, Trans::no, n, in, out, C(1), dy, out, w, in, dx_first ? C(0) : C(1), dx, in, ws, workers);
  if (dw != nullptr) gemm(Trans::yes, Trans::no, out, in, n, C(1), dy, out, x, in, dw_first ? C(0) : C(1), dw, in, ws, workers);
  if (db != nullptr) column_sums(n, out, workers, db, db_first, [&](std::int64_t r, std::int64_t j) { return widen(dy[r * out + j]); });
}

// Rows of W dequantized per round: one 64-row panel per worker, in scratch
// (workers * 64, In); the GEMM then runs over that block of columns of y.
inline std::int64_t quant_panel_rows(int workers) { return static_cast<std::int64_t>(workers) * 64; }

namespace detail {
template <class T>
void dequantize_panel(const QuantView& w, std::int64_t p0, std::int64_t rows, T* panel, int workers) {
  team_for_this_cpu(workers, [&](int wk, int count) {
    const Range r = share((rows + 63) / 64, count, wk);
    for (std::int64_t t = r.begin; t < r.end; ++t) {
      const std::int64_t a = p0 + t * 64, b = a + 64 < p0 + rows ? a + 64 : p0 + rows;
      dequantize_rows(w, a, b, panel + (a - p0) * w.cols);
    }
  });
}
}  // namespace detail

// y (N, Out) = x (N, In) dequant(W)^T, one panel of W's rows at a time
// (the panel holds T: bf16 in a bf16 run, in the first half of its scratch).
template <class T, class C = compute_t<T>>
void quant_linear_forward(const T* x, const QuantView& w, T* y, std::int64_t n, const Epilogue<T>& ep, T* panel,
                          const GemmPanels<C>& ws, int workers) {
  const std::int64_t in = w.cols, out = w.rows, step = quant_panel_rows(workers);
  for (std::int64_t p0 = 0; p0 < out; p0 += step) {
    const std::int64_t rows = p0 + step < out ? step : out - p0;
    detail::dequantize_panel(w, p0, rows, panel, workers);
    gemm(Trans::no, Trans::yes, n, rows, in, C(1), x, in, panel, in, C(0), y + p0, out, ws, workers);
  }
  if (ep.bias != nullptr || ep.act != Fused::none)
    team(workers, [&](int wk, int count) {
      const Range r = share(n, count, wk);
      detail::apply_epilogue(ep, y, r.begin, r.end, out);
    });
}

// LLM.int8 (math/llm_int8.hpp): y (N, Out) = the decomposed product of x
// (N, In) and the row-wise int8 W, then the epilogue. `scratch` is the op's
// forward scratch (math::int8_scratch's layout). Returns the number of
// outlier columns found; above the plan's bound (w.q.max_outliers) nothing
// is computed and y is not written (the op refuses the batch).
template <class T, class C = compute_t<T>>
std::int64_t llm_int8_forward(const T* x, const QuantView& w, T* y, std::int64_t n, const Epilogue<T>& ep, std::byte* scratch,
                              int workers) {
  const std::int64_t in = w.cols, out = w.rows, bound = w.q.max_outliers;
  const math::Int8Scratch at = math::int8_scratch(n, in, bound);
  auto* xq = reinterpret_cast<std::int8_t*>(scratch + at.xq);           // (N, In)
  auto* row_scale = reinterpret_cast<float*>(scratch + at.row_scale);   // (N) (f32: an F64 run keeps s in f32 too)
  auto* marks = reinterpret_cast<std::int32_t*>(scratch + at.marks);    // (In)
  auto* outliers = reinterpret_cast<std::int32_t*>(scratch + at.outliers);  // (bound)
  // 1. the outlier columns: some |x| >= threshold in the batch
  const C threshold = w.q.outlier_threshold;
  team(workers, [&](int wk, int count) {
    const Range c = share(in, count, wk);
    for (std::int64_t j = c.begin; j < c.end; ++j) marks[j] = 0;
    if (!w.q.decomposed()) return;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = c.begin; j < c.end; ++j) marks[j] |= std::abs(widen(x[i * in + j])) >= threshold ? 1 : 0;
  });
  std::int64_t found = 0;
  for (std::int64_t j = 0; j < in; ++j)
    if (marks[j] != 0) {
      if (found < bound) outliers[found] = static_cast<std::int32_t>(j);
      ++found;
    }
  reinterpret_cast<std::int32_t*>(scratch + at.count)[0] = static_cast<std::int32_t>(found);
  if (found > bound) return found;
  // 2. the rest of each row in int8: its absmax over the other columns
  parallel_for(n, workers, [&](std::int64_t i, int) {
    const T* xi = x + i * in;
    C s = 0;
    for (std::int64_t j = 0; j < in; ++j)
      if (marks[j] == 0) s = std::max(s, static_cast<C>(std::abs(widen(xi[j]))));
    row_scale[i] = static_cast<float>(s);
    const C inv = math::int8_inverse_scale(static_cast<C>(row_scale[i]));
    for (std::int64_t j = 0; j < in; ++j) xq[i * in + j] = marks[j] == 0 ? math::int8_input_code(static_cast<C>(widen(xi[j])), inv) : 0;
  });
  // 3. y = int8 product (int32 sums) dequantized + the outlier columns' f32 product,
  // a tile of rows at a time so its codes stay in cache while W streams by
  const auto* codes = reinterpret_cast<const std::int8_t*>(w.codes);
  constexpr std::int64_t tile = 64;
  team(workers, [&](int wk, int count) {
    const Range o_range = share(out, count, wk);
    for (std::int64_t i0 = 0; i0 < n; i0 += tile) {
      const std::int64_t i1 = std::min(n, i0 + tile);
      for (std::int64_t o = o_range.begin; o < o_range.end; ++o) {
        const std::int8_t* c = codes + o * in;
        const C a = w.block_absmax(o), a_over_q = a / C(127);
        for (std::int64_t i = i0; i < i1; ++i) {
          const std::int8_t* q = xq + i * in;
          std::int32_t acc = 0;
          for (std::int64_t j = 0; j < in; ++j) acc += static_cast<std::int32_t>(q[j]) * static_cast<std::int32_t>(c[j]);
          C v = static_cast<C>(acc) * (static_cast<C>(row_scale[i]) * a) * (C(1) / C(127 * 127));
          for (std::int64_t k = 0; k < found; ++k) {
            const std::int64_t j = outliers[k];
            v += static_cast<C>(widen(x[i * in + j])) * (static_cast<C>(c[j]) * a_over_q);
          }
          y[i * out + o] = narrow<T>(v);
        }
      }
    }
  });
  if (ep.bias != nullptr || ep.act != Fused::none)
    team(workers, [&](int wk, int count) {
      const Range r = share(n, count, wk);
      detail::apply_epilogue(ep, y, r.begin, r.end, out);
    });
  return found;
}

// dx (N, In) (+)= dy (N, Out) dequant(W), panel by panel.
template <class T, class C = compute_t<T>>
void quant_linear_backward_input(const T* dy, const QuantView& w, T* dx, bool dx_first, std::int64_t n, T* panel,
                                 const GemmPanels<C>& ws, int workers) {
  const std::int64_t in = w.cols, out = w.rows, step = quant_panel_rows(workers);
  for (std::int64_t p0 = 0; p0 < out; p0 += step) {
    const std::int64_t rows = p0 + step < out ? step : out - p0;
    detail::dequantize_panel(w, p0, rows, panel, workers);
    const C beta = (p0 == 0 && dx_first) ? C(0) : C(1);
    gemm(Trans::no, Trans::no, n, in, rows, C(1), dy + p0, out, panel, in, beta, dx, in, ws, workers);
  }
}

// LoRA's dropout of its input (PEFT's lora_dropout, math/dropout.hpp):
// xd (N, In) = dropout(x); and dx (+)= dropout'(t), the backward through the
// same mask and scale, t (N, In) in the compute type.
template <class T>
void dropout_rows(const T* x, T* xd, std::int64_t n, std::int64_t in, const math::Dropout& d, int workers) {
  parallel_for_this_cpu(n, workers, [&](std::int64_t r, int) {
    for (std::int64_t c = 0; c < in; ++c) xd[r * in + c] = narrow<T>(d.apply(widen(x[r * in + c]), r, c));
  });
}
template <class T, class C = compute_t<T>>
void dropout_backward_rows(const C* t, T* dx, bool dx_first, std::int64_t n, std::int64_t in, const math::Dropout& d,
                           int workers) {
  parallel_for_this_cpu(n, workers, [&](std::int64_t r, int) {
    for (std::int64_t c = 0; c < in; ++c) {
      const C g = d.apply(t[r * in + c], r, c);
      dx[r * in + c] = narrow<T>(dx_first ? g : widen(dx[r * in + c]) + g);
    }
  });
}

// LoRA forward: ax (N, r) = x A^T; y (N, Out) += s * ax B^T (when y is given:
// a recompute that only needs A x passes none). With an active dropout d,
// the adapter reads xd = dropout(x) (N, In), written into `dropped` first.
template <class T, class C = compute_t<T>>
void lora_forward(const T* x, const T* a, const T* b, T* ax, T* y, C scale, std::int64_t n, std::int64_t in, std::int64_t out,
                  std::int64_t rank, const GemmPanels<C>& ws, int workers, const math::Dropout& d = {}, T* dropped = nullptr) {
  const T* xa = x;
  if (d.active()) {
    dropout_rows(x, dropped, n, in, d, workers);
    xa = dropped;
  }
  gemm(Trans::no, Trans::yes, n, rank, in, C(1), xa, in, a, in, C(0), ax, rank, ws, workers);
  if (y != nullptr) gemm(Trans::no, Trans::yes, n, out, rank, scale, ax, rank, b, rank, C(1), y, out, ws, workers);
}

// LoRA backward from dy (N, Out), the saved x and ax:
//   dB (+)= s dy^T ax;  dax = s dy B (scratch, T);  dA (+)= dax^T x;  dx (+)= dax A.
// With an active dropout d, x is dropout(x) in dA (regenerated into
// `dropped`, (N, In) compute-type elements of scratch), and dx (+)=
// dropout'(dax A) (the product in the same scratch).
template <class T, class C = compute_t<T>>
void lora_backward(const T* dy, const T* x, const T* ax, const T* a, const T* b, T* dax, T* da, bool da_first, T* db,
                   bool db_first, T* dx, bool dx_first, C scale, std::int64_t n, std::int64_t in, std::int64_t out,
                   std::int64_t rank, const GemmPanels<C>& ws, int workers, const math::Dropout& d = {},
                   void* dropped = nullptr) {
  if (db != nullptr)
    gemm(Trans::yes, Trans::no, out, rank, n, scale, dy, out, ax, rank, db_first ? C(0) : C(1), db, rank, ws, workers);
  gemm(Trans::no, Trans::no, n, rank, out, scale, dy, out, b, rank, C(0), dax, rank, ws, workers);
  if (!d.active()) {
    if (da != nullptr)
      gemm(Trans::yes, Trans::no, rank, in, n, C(1), dax, rank, x, in, da_first ? C(0) : C(1), da, in, ws, workers);
    if (dx != nullptr) gemm(Trans::no, Trans::no, n, in, rank, C(1), dax, rank, a, in, dx_first ? C(0) : C(1), dx, in, ws, workers);
    return;
  }
  if (da != nullptr) {
    T* xd = static_cast<T*>(dropped);  // (N, In)
    dropout_rows(x, xd, n, in, d, workers);
    gemm(Trans::yes, Trans::no, rank, in, n, C(1), dax, rank, xd, in, da_first ? C(0) : C(1), da, in, ws, workers);
  }
  if (dx != nullptr) {
    C* t = static_cast<C*>(dropped);  // (N, In): dax A
    gemm(Trans::no, Trans::no, n, in, rank, C(1), dax, rank, a, in, C(0), t, in, ws, workers);
    dropout_backward_rows(t, dx, dx_first, n, in, d, workers);
  }
}

}  // namespace headroom::host
