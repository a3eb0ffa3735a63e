#pragma once
// A quantized weight matrix in the arena (math::QuantView: layout in
// math/quant_view.hpp), and panel-at-a-time dequantization.
// The whole dequantized matrix never exists: kernels ask for rows [r0, r1).
#include <cstdint>
#include <vector>

#include "../core/quant_format.hpp"
#include "../math/blockwise_int.hpp"
#include "../math/dynamic_map.hpp"
#include "../math/nf4.hpp"
#include "../math/quant_view.hpp"
#include "parallel.hpp"
#include "storage.hpp"

namespace headroom::host {

using math::QuantView;

// Fills the model's code tables (once, when the trainer starts).
inline void fill_quant_table(float* table, bool double_quant) {
  for (int i = 0; i < 16; ++i) table[i] = math::nf4_code(i);
  if (double_quant) math::make_dynamic_map(true, table + 16);
}

// Rows [r0, r1) of the matrix, dequantized: out (r1 - r0, cols).
template <class T>
void dequantize_rows(const QuantView& w, std::int64_t r0, std::int64_t r1, T* out) {
  const std::int64_t begin = r0 * w.cols, end = r1 * w.cols, block = w.q.block;
  for (std::int64_t b0 = begin; b0 < end; b0 += block) {  // blocks never straddle rows (block divides cols)
    const float a = w.block_absmax(b0 / block);
    T* o = out + (b0 - begin);
    switch (w.q.kind) {
      case QuantKind::nf4:
        for (std::int64_t i = 0; i < block; i += 2) {
          const std::uint8_t byte = w.codes[(b0 + i) >> 1];
          o[i] = narrow<T>(math::nf4_code(byte >> 4) * a);
          o[i + 1] = narrow<T>(math::nf4_code(byte & 15) * a);
        }
        break;
      case QuantKind::int4: {
        const float s = a / math::IntFormat<4>::qmax;
        for (std::int64_t i = 0; i < block; ++i) o[i] = narrow<T>(math::int4_unpack(w.codes, b0 + i) * s);
        break;
      }
      case QuantKind::int8: {
        const float s = a / math::IntFormat<8>::qmax;
        const auto* c = reinterpret_cast<const std::int8_t*>(w.codes);
        for (std::int64_t i = 0; i < block; ++i) o[i] = narrow<T>(c[b0 + i] * s);
        break;
      }
      case QuantKind::none: break;
    }
  }
}

// Quantizes rows [r0, r1) from dense values: x (r1 - r0, cols) f32. Plain
// formats only write their own blocks; double quantization of the absmaxes
// (which needs every block's absmax) is finish_double_quant, run once after
// all rows are in. `staging` holds the plain absmaxes until then: (blocks) f32.
inline void quantize_rows(const QuantView& w, std::int64_t r0, std::int64_t r1, const float* x, float* staging) {
  const std::int64_t begin = r0 * w.cols, end = r1 * w.cols, block = w.q.block;
  float* absmax = w.q.double_quant ? staging : w.absmax();
  for (std::int64_t b0 = begin; b0 < end; b0 += block) {
    const float* v = x + (b0 - begin);
    const std::int64_t b = b0 / block;
    switch (w.q.kind) {
      case QuantKind::nf4:
        absmax[b] = math::quantize_nf4_block(v, static_cast<int>(block), w.codes + (b0 >> 1));
        break;
      case QuantKind::int4:
        math::quantize_blockwise_int4(v, block, static_cast<int>(block), w.codes + (b0 >> 1), absmax + b);
        break;
      case QuantKind::int8:
        math::quantize_blockwise_int8(v, block, static_cast<int>(block), reinterpret_cast<std::int8_t*>(w.codes) + b0,
                                      absmax + b);
        break;
      case QuantKind::none: break;
    }
  }
}

inline void finish_double_quant(const QuantView& w, const float* staging) {
  if (!w.q.double_quant || w.table == nullptr) return;  // (the plan always has the table with double quantization)
  math::double_quantize_absmax(staging, w.blocks(), w.dq_map(), w.dq_codes(), w.absmax2(), w.offset());
}

// Quantizes a whole matrix from dense values x (rows, cols) f32, double
// quantization included; `workers` threads take a share of the rows each
// (blocks never straddle rows, so the codes do not depend on the count).
inline void quantize_matrix(const QuantView& w, const float* x, int workers = 1) {
  std::vector<float> staging(static_cast<std::size_t>(w.blocks()));
  team(workers, [&](int k, int count) {
    const Range r = share(w.rows, count, k);
    if (r.size() > 0) quantize_rows(w, r.begin, r.end, x + r.begin * w.cols, staging.data());
  });
  finish_double_quant(w, staging.data());
}

}  // namespace headroom::host
