#pragma once
// RunConfig: everything about a run that fixes memory and is not the model
// itself, as the builders and the planner read it (Train<...>::config()).
#include <cstdint>

#include "../core/bytes.hpp"
#include "../core/dtype.hpp"
#include "../core/optim_state.hpp"

namespace headroom {

// The engine a run is planned for: the host (CPU) engine, or the CUDA engine
// (Train<..., OnCuda>). The model's tensors are the same; what the kernels
// need besides them (GEMM workspace, scratch) differs.
enum class Engine : std::uint8_t { host, cuda };

// Everything about a run that fixes memory and is not the model itself.
struct RunConfig {
  std::int64_t batch = 1;         // sequences per micro-batch
  std::int64_t seq = 1;           // tokens per sequence
  DType dtype = DType::F32;       // storage of weights, grads and activations
  OptimDesc optim{};              // optimizer state per trainable element
  int accumulate = 1;             // micro-batches per optimizer step
  bool update_in_backward = false;
  // ZeRO-Offload (OffloadOptimizer): optimizer state, master weights and
  // gradients in the offload tier, updated by the host
  bool offload_optimizer = false;
  // ZeRO-Infinity's parameter offload (OffloadParameters): the parameters
  // too, fetched into device buffers for each event that reads them
  bool offload_params = false;
  int workers = 1;                // threads / CTAs that own a private scratch tile
  std::int64_t loss_chunk = 256;  // tokens per LM-head + cross-entropy chunk
  std::int64_t alignment = 256;   // every buffer starts on this boundary
  Engine engine = Engine::host;   // the kernels the scratch and workspace are sized for
  int dp = 1;                     // data-parallel ranks (DataParallel<N>); the plan is one rank's
  int zero = 0;                   // ZeRO stage over them: 1 optimizer states, 2 + gradients, 3 + parameters
  int tp = 1;                     // tensor-parallel ranks (TensorParallel<N>); the plan is one rank's
  int pp = 1;                     // pipeline stages (PipelineParallel<S>); the plan is one stage's
  int stage = 0;                  // the stage planned, 0 .. pp - 1 (-1: a pipelined run type before its stage is chosen)

  constexpr std::int64_t tokens() const { return batch * seq; }
  // Processes of the run: pipeline stages of data-parallel groups of tensor-parallel ranks.
  constexpr int world() const { return pp * dp * tp; }
  // Pipeline parallelism: the stage holds the layers before the model's
  // Repeat (first stage), its share of the Repeat's blocks, the layers after
  // it (last stage); micro-batches in flight at once on this stage under 1F1B
  // (its forward activations live until its backward: so many copies).
  constexpr bool first_stage() const { return stage <= 0; }
  constexpr bool last_stage() const { return stage < 0 || stage == pp - 1; }
  constexpr int in_flight() const { return pp <= 1 ? 1 : (pp - stage < accumulate ? pp - stage : accumulate); }
  // Whether the data-parallel ranks shard what ZeRO stage `stage` shards.
  constexpr bool sharded(int stage) const { return dp > 1 && zero >= stage; }
  // Elements of one rank's shard of an n-element parameter: an equal block
  // per rank, a multiple of shard_grain elements (whole blocks of
  // AdamW8bit's 256-element quantization, 256-byte aligned), so the ranks'
  // blocks, laid end to end, cover n with padding at the end.
  static constexpr std::int64_t shard_grain = 256;
  constexpr std::int64_t shard(std::int64_t n) const { return align_up(ceil_div(n, dp), shard_grain); }
  // Bytes of one rank's shard of a b-byte tensor stored as bytes (quantized codes, scales).
  constexpr std::int64_t shard_bytes(std::int64_t b) const { return align_up(ceil_div(b, dp), 256); }
  constexpr std::int64_t act_bytes() const { return size_of(dtype); }
  // Element bytes of statistics and scratch (f32, or f64 when the run is f64).
  constexpr std::int64_t compute_bytes() const { return dtype == DType::F64 ? 8 : 4; }
  constexpr bool cuda() const { return engine == Engine::cuda; }
  // OffloadOptimizer: the update runs over ranges of so many elements of a
  // parameter (a multiple of AdamW8bit's 256-element block); on the host
  // engine each range's gradient, optimizer state (and, with
  // OffloadParameters, values) is read from the offload tier's file into a
  // device-tier staging buffer and written back.
  static constexpr std::int64_t update_chunk = std::int64_t{1} << 14;
  // The staging buffer for ranges of `elements` (update_chunk, or fewer
  // when no parameter has so many): the gradient (and the values), then the
  // optimizer state.
  // One slot holds a range: its gradient (and with OffloadParameters its
  // values), then its optimizer state; the buffer has a slot per worker,
  // which updates its own ranges in it after the backward.
  constexpr std::int64_t update_staging_slot_bytes(std::int64_t elements) const {
    if (!offload_optimizer || cuda()) return 0;
    const std::int64_t values = (offload_params ? 2 : 1) * elements * act_bytes();
    return align_up(values, 256) + align_up(optim.state_bytes(elements), 256);
  }
  constexpr std::int64_t update_staging_bytes(std::int64_t elements) const {
    return workers * update_staging_slot_bytes(elements);
  }
};

}  // namespace headroom
