#pragma once
// The sliding window of causal attention (Mistral's; transformers masks key
// j for query i unless i - window < j <= i): which keys a query reaches and
// which queries reach a key. window 0: no window (every earlier position).
// Shared by the host and CUDA attention kernels.
#include <cstdint>

#include "../core/config.hpp"

namespace headroom::math {

// The first key position that query position p attends to.
HEADROOM_HOST_DEVICE constexpr std::int64_t attention_window_start(std::int64_t p, std::int64_t window) {
  return window > 0 && p >= window ? p - window + 1 : 0;
}
// The last query position (below seq) that attends to key position j; written
// so that a window of any size cannot overflow.
HEADROOM_HOST_DEVICE constexpr std::int64_t attention_window_end(std::int64_t j, std::int64_t window, std::int64_t seq) {
  return window > 0 && window <= seq - j ? j + window - 1 : seq - 1;
}

}  // namespace headroom::math
