#pragma once
// LLM.int8() (Dettmers et al. 2022, arXiv:2208.07339): the forward of a
// projection whose weight W (out, in) is int8 with one absmax per row
// (core/quant_format.hpp, LLMInt8<>), written once for both engines.
//
//   O       = the input's outlier columns: j with |x[i, j]| >= threshold for
//             some row i of the batch (none when the threshold is 0)
//   s_i     = max_{j not in O} |x[i, j]|                       (row absmax)
//   xq[i,j] = round_half_even(x[i, j] * (127 / s_i)), 0 for j in O
//   y[i, o] = float(sum_j xq[i, j] cb[o, j]) * (s_i * a_o) / 127^2          (int32 sums)
//           + sum_{j in O} x[i, j] * (cb[o, j] * (a_o / 127))              (f32)
//
// cb: the weight's int8 codes, a_o: row o's absmax. The outlier columns'
// weights are the int8 ones dequantized (as bitsandbytes does when the
// weights are stored in int8 only). The backward is not quantized:
// dx = dy dequant(W), the frozen weight takes no gradient.
//
// The op's forward scratch (plan and kernels agree through Int8Scratch):
//   xq        int8  (N, in)  the quantized input
//   row_scale f32   (N)      s_i
//   marks     int32 (in)     1 where the column is an outlier
//   outliers  int32 (K)      the outlier columns in increasing order, K = the plan's bound
//   count     int32 (4)      [0]: outlier columns found (may exceed K: then refused)
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../core/bytes.hpp"
#include "../core/config.hpp"

namespace headroom {

// A batch whose input to an LLM.int8 projection has more outlier columns
// than the plan holds (LLMInt8<Threshold, MaxOutliers>): the step stops
// before any update (the weights and optimizer state are those before it).
class outlier_bound_exceeded : public std::runtime_error {
 public:
  outlier_bound_exceeded(std::string layer, std::int64_t found, std::int64_t bound, float threshold)
      : std::runtime_error("headroom: LLM.int8: the input of " + (layer.empty() ? std::string("a projection") : layer) + " has " +
                           std::to_string(found) + " outlier columns (|x| >= " + std::to_string(threshold) +
                           ") in this batch, more than the plan's bound of " + std::to_string(bound) +
                           " (LLMInt8<Threshold, MaxOutliers>): raise MaxOutliers or the threshold; the step was stopped before any update"),
        layer_(std::move(layer)), found_(found), bound_(bound), threshold_(threshold) {}
  const std::string& layer() const { return layer_; }
  std::int64_t found() const { return found_; }
  std::int64_t bound() const { return bound_; }
  float threshold() const { return threshold_; }
  // The same error, naming the layer (the engines add it where they know it).
  outlier_bound_exceeded in(std::string layer) const { return {std::move(layer), found_, bound_, threshold_}; }

 private:
  std::string layer_;
  std::int64_t found_, bound_;
  float threshold_;
};

}  // namespace headroom

namespace headroom::math {

struct Int8Scratch {
  std::int64_t xq = 0, row_scale = 0, marks = 0, outliers = 0, count = 0, bytes = 0;  // byte offsets, total
};

constexpr Int8Scratch int8_scratch(std::int64_t n, std::int64_t in, std::int64_t max_outliers) {
  Int8Scratch s{};
  s.xq = 0;
  s.row_scale = align_up(n * in, 16);
  s.marks = s.row_scale + align_up(4 * n, 16);
  s.outliers = s.marks + align_up(4 * in, 16);
  s.count = s.outliers + align_up(4 * max_outliers, 16);
  s.bytes = s.count + 16;
  return s;
}

inline constexpr float int8_qmax = 127.0f;
inline constexpr float int8_dequant = 1.0f / (127.0f * 127.0f);  // of an int32 product sum

// One row's code of x (j not an outlier column): round half to even of
// x * (127 / s), 0 for a row whose non-outlier values are all 0. F: the
// compute type (float; double in an F64 run).
template <class F>
HEADROOM_HOST_DEVICE inline std::int8_t int8_input_code(F x, F inv_scale) {
  const F v = x * inv_scale;  // |v| <= 127 (s is the row's absmax)
  F r = static_cast<F>(static_cast<int>(v));  // toward zero
  const F frac = v - r;
  if (frac > F(0.5) || (frac == F(0.5) && static_cast<int>(r) % 2 != 0)) r += F(1);
  else if (frac < F(-0.5) || (frac == F(-0.5) && static_cast<int>(r) % 2 != 0)) r -= F(1);
  return static_cast<std::int8_t>(static_cast<int>(r));
}
template <class F>
HEADROOM_HOST_DEVICE inline F int8_inverse_scale(F s) { return s > F(0) ? F(127) / s : F(0); }

}  // namespace headroom::math
