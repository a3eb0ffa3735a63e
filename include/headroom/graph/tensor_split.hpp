#pragma once
// How a parameter is divided over the tensor-parallel ranks (Megatron-LM,
// Shoeybi et al. 2019): each rank holds a contiguous block of rows, or of
// columns, of the whole matrix.
//
//   column-parallel projection  W (out, in): rows split, rank r holds rows
//                               [r out/t, (r+1) out/t); its bias too
//   row-parallel projection     W (out, in): columns split, rank r holds
//                               columns [r in/t, (r+1) in/t); its bias whole
//   vocabulary-parallel table   E (vocab, D): rows split
//
// A fused projection (GPT-2's c_attn: q | k | v stacked) is split part by
// part: its rows are `parts` equal parts, and rank r holds its block of
// each, stacked in the same order, so its local q | k | v are its heads.
#include <cstdint>

namespace headroom {

enum class SplitAxis : std::uint8_t { none, rows, cols };

struct TensorSplit {
  SplitAxis axis = SplitAxis::none;
  int parts = 1;   // rows split: equal parts of the whole, each split on its own
  int ranks = 1;   // the tensor-parallel ranks it is split over

  constexpr bool split() const { return axis != SplitAxis::none && ranks > 1; }

  // The whole's row-major index of element i of rank r's block, a
  // (rows, cols) matrix.
  constexpr std::int64_t whole_index(std::int64_t rows, std::int64_t cols, int r, std::int64_t i) const {
    const std::int64_t row = i / cols, col = i % cols;
    if (!split()) return i;
    if (axis == SplitAxis::cols) return row * cols * ranks + static_cast<std::int64_t>(r) * cols + col;
    const std::int64_t part_rows = rows / parts;  // this rank's rows of one part
    const std::int64_t part = row / part_rows, q = row % part_rows;
    return ((part * ranks + r) * part_rows + q) * cols + col;
  }
  // The whole's rows and columns.
  constexpr std::int64_t whole_rows(std::int64_t rows) const { return split() && axis == SplitAxis::rows ? rows * ranks : rows; }
  constexpr std::int64_t whole_cols(std::int64_t cols) const { return split() && axis == SplitAxis::cols ? cols * ranks : cols; }
};

}  // namespace headroom
