#pragma once
// Train<Model, Options...>: everything that fixes the memory of a step.
//
//   using Run = Train<Model, Batch<4>, Seq<2048>, AdamW8bit, Precision<BF16>>;
//
// Options (any order, each at most once; defaults in brackets):
//   Batch<B> [1]        sequences per micro-batch
//   Seq<T> [required]   tokens per sequence
//   an optimizer [AdamW]: SGD<...>, AdamW, AdamW8bit
//   Precision<T> [F32]  storage of weights, grads, activations; f32 master
//                       weights when T is 16-bit
//   Accumulate<K> [1]   micro-batches per optimizer step (grads then live the
//                       whole step)
//   UpdateInBackward    each layer's optimizer step runs inside its backward
//                       and its grads are freed there (needs Accumulate<1>)
//   Workers<W> [1]      threads / CTAs with private scratch tiles
//   LossChunk<C> [256]  tokens per chunk of the fused LM head + loss
//   OnCuda              plan for the CUDA engine (cuda::Trainer): its GEMM
//                       workspace and kernels' scratch instead of the host's
//   DataParallel<N> [1] N ranks, each training Batch<B> sequences per
//                       micro-batch of its own; gradients are averaged over
//                       them (the global batch is N x B x K sequences)
//   ZeRO<S> [0]         what the data-parallel ranks shard (Rajbhandari et
//                       al. 2020): 1 optimizer states (and master weights),
//                       2 + gradients, 3 + parameters; the plan is one rank's
//   TensorParallel<N> [1] N ranks split each block's attention heads and
//                       feed-forward width, and the vocabulary of the
//                       embedding and LM head (Megatron-LM); the plan is
//                       one rank's; DataParallel x TensorParallel ranks in all
//   PipelineParallel<S> [1] S stages, each with an equal share of the blocks
//                       of the model's Repeat (the first also the layers
//                       before it, the last those after it), running the
//                       Accumulate<K> micro-batches of a step under 1F1B;
//                       S x DataParallel x TensorParallel processes in all.
//                       plan<Run>() is the plan of the stage with the
//                       largest peak; plan<pipeline_stage<Run, s>>() stage s's
//   OffloadOptimizer    ZeRO-Offload (Ren et al. 2021): optimizer state,
//                       master weights and gradients live in the offload
//                       tier; each gradient is streamed there when it is
//                       complete, and the host's threads update the weights
//                       (overlapping the backward of earlier layers when the
//                       gradients are not clipped); the device keeps the
//                       weights and only the gradients in flight
//   OffloadParameters   ZeRO-Infinity's parameter offload (Rajbhandari et
//                       al. 2021), with OffloadOptimizer: the parameters
//                       too live in the offload tier; before each event
//                       that reads them a fetch copies them into a device
//                       buffer, planned from the compute event before (so
//                       an engine may stream them one op ahead)
#include <type_traits>

#include "layers/layer.hpp"
#include "layers/pipeline_stages.hpp"
#include "layers/tensor_parallel.hpp"
#include "optim/adamw.hpp"
#include "optim/optimizer.hpp"

namespace headroom {

template <std::int64_t B>
struct Batch {
  HEADROOM_REQUIRE(B >= 1, "Batch<B>: B must be at least 1 (it is {})", B);
  static constexpr std::int64_t value = B;
};
template <std::int64_t T>
struct Seq {
  HEADROOM_REQUIRE(T >= 1, "Seq<T>: T must be at least 1 (it is {})", T);
  static constexpr std::int64_t value = T;
};
template <DType T>
struct Precision {
  static_assert(T == DType::F32 || T == DType::BF16 || T == DType::F16 || T == DType::F64,
                "Precision<T>: T must be F32, BF16, F16 or F64");
  static constexpr DType value = T;
};
template <int K>
struct Accumulate {
  HEADROOM_REQUIRE(K >= 1, "Accumulate<K>: K must be at least 1 (it is {})", K);
  static constexpr int value = K;
};
template <int W>
struct Workers {
  HEADROOM_REQUIRE(W >= 1, "Workers<W>: W must be at least 1 (it is {})", W);
  static constexpr int value = W;
};
template <std::int64_t C>
struct LossChunk {
  HEADROOM_REQUIRE(C >= 1, "LossChunk<C>: C must be at least 1 (it is {})", C);
  static constexpr std::int64_t value = C;
};
struct UpdateInBackward {};
struct OnCuda {};
struct OffloadOptimizer {};
struct OffloadParameters {};
template <int N>
struct DataParallel {
  static constexpr std::string_view kind = "DataParallel";
  HEADROOM_REQUIRE(N >= 1, "DataParallel<N>: N (the data-parallel ranks) must be at least 1 (it is {})", N);
  static constexpr int value = N;
};
template <int N>
struct TensorParallel {
  static constexpr std::string_view kind = "TensorParallel";
  HEADROOM_REQUIRE(N >= 1, "TensorParallel<N>: N (the tensor-parallel ranks) must be at least 1 (it is {})", N);
  static constexpr int value = N;
};
template <int S>
struct PipelineParallel {
  static constexpr std::string_view kind = "PipelineParallel";
  HEADROOM_REQUIRE(S >= 1, "PipelineParallel<S>: S (the pipeline stages) must be at least 1 (it is {})", S);
  static constexpr int value = S;
};
namespace detail {
// The stage a pipelined run type is planned for (pipeline_stage<Run, s>).
template <int S>
struct PipelineStage {
  static constexpr int value = S;
};
}  // namespace detail
template <int S>
struct ZeRO {
  HEADROOM_REQUIRE(S >= 0 && S <= 3,
                   "ZeRO<S>: S is the stage, 0 (nothing sharded) to 3 (optimizer states, gradients and parameters sharded); it is {}",
                   S);
  static constexpr int value = S;
};

namespace detail {
template <class T, template <auto...> class Tmpl>
struct is_instance : std::false_type {};
template <template <auto...> class Tmpl, auto... V>
struct is_instance<Tmpl<V...>, Tmpl> : std::true_type {};

template <template <auto...> class Tmpl, auto Default, class... Os>
constexpr auto option_value() {
  auto v = Default;
  (
      [&] {
        if constexpr (is_instance<Os, Tmpl>::value) v = Os::value;
      }(),
      ...);
  return v;
}
template <template <auto...> class Tmpl, class... Os>
inline constexpr int option_count = (0 + ... + (is_instance<Os, Tmpl>::value ? 1 : 0));

// A model with learned / limited positions declares max_seq.
template <class M>
constexpr bool fits_context(std::int64_t seq) {
  if constexpr (requires { M::max_seq; }) return seq <= M::max_seq;
  else return true;
}
template <class M>
constexpr std::int64_t context_length() {
  if constexpr (requires { M::max_seq; }) return M::max_seq;
  else return -1;
}

template <class... Os>
struct find_optimizer {
  using type = AdamW;
};
template <class O, class... Os>
struct find_optimizer<O, Os...> {
  using type = std::conditional_t<Optimizer<O>, O, typename find_optimizer<Os...>::type>;
};

template <class O>
inline constexpr bool known_option =
    is_instance<O, Batch>::value || is_instance<O, Seq>::value || is_instance<O, Precision>::value ||
    is_instance<O, Accumulate>::value || is_instance<O, Workers>::value || is_instance<O, LossChunk>::value ||
    is_instance<O, DataParallel>::value || is_instance<O, ZeRO>::value || is_instance<O, TensorParallel>::value ||
    is_instance<O, PipelineParallel>::value || is_instance<O, PipelineStage>::value || std::is_same_v<O, UpdateInBackward> ||
    std::is_same_v<O, OnCuda> || std::is_same_v<O, OffloadOptimizer> ||
    std::is_same_v<O, OffloadParameters> || Optimizer<O>;
}  // namespace detail

template <class M, class... Options>
struct Train {
  static_assert(Layer<M>, "Train<Model, ...>: Model must satisfy the Layer concept (see layers/layer.hpp)");
  static_assert((detail::known_option<Options> && ...),
                "Train<Model, Options...>: an option is not one of Batch, Seq, Precision, Accumulate, Workers, LossChunk, "
                "UpdateInBackward, OnCuda, OffloadOptimizer, OffloadParameters, DataParallel, ZeRO, TensorParallel, "
                "PipelineParallel or an optimizer");
  static_assert(detail::option_count<Seq, Options...> == 1, "Train<Model, ...>: give the sequence length exactly once, as Seq<T>");
  static_assert(detail::option_count<Batch, Options...> <= 1 && detail::option_count<Precision, Options...> <= 1 &&
                    detail::option_count<Accumulate, Options...> <= 1 && detail::option_count<DataParallel, Options...> <= 1 &&
                    detail::option_count<ZeRO, Options...> <= 1 && detail::option_count<TensorParallel, Options...> <= 1 &&
                    detail::option_count<PipelineParallel, Options...> <= 1,
                "Train<Model, ...>: each option may be given at most once");
  static_assert((0 + ... + (Optimizer<Options> ? 1 : 0)) <= 1, "Train<Model, ...>: give at most one optimizer");

  using model = M;
  using optimizer = typename detail::find_optimizer<Options...>::type;
  static constexpr std::int64_t batch = detail::option_value<Batch, std::int64_t{1}, Options...>();
  static constexpr std::int64_t seq = detail::option_value<Seq, std::int64_t{0}, Options...>();
  static constexpr DType dtype = detail::option_value<Precision, DType::F32, Options...>();
  static constexpr int accumulate = detail::option_value<Accumulate, 1, Options...>();
  static constexpr int workers = detail::option_value<Workers, 1, Options...>();
  static constexpr std::int64_t loss_chunk = detail::option_value<LossChunk, std::int64_t{256}, Options...>();
  static constexpr bool update_in_backward = (std::is_same_v<Options, UpdateInBackward> || ...);
  static constexpr Engine engine = (std::is_same_v<Options, OnCuda> || ...) ? Engine::cuda : Engine::host;
  static constexpr bool offload_optimizer = (std::is_same_v<Options, OffloadOptimizer> || ...);
  static constexpr bool offload_params = (std::is_same_v<Options, OffloadParameters> || ...);
  static constexpr int data_parallel = detail::option_value<DataParallel, 1, Options...>();
  static constexpr int zero = detail::option_value<ZeRO, 0, Options...>();
  static constexpr int tensor_parallel = detail::option_value<TensorParallel, 1, Options...>();
  static constexpr int pipeline_parallel = detail::option_value<PipelineParallel, 1, Options...>();
  // -1: a pipelined run type whose stage is not chosen (pipeline_stage<Run, s> chooses it)
  static constexpr int stage = detail::option_value<detail::PipelineStage, (pipeline_parallel > 1 ? -1 : 0), Options...>();

  static_assert(!update_in_backward || accumulate == 1,
                "Train<Model, ...>: UpdateInBackward frees each layer's grads right after its update, so it needs Accumulate<1>");
  HEADROOM_REQUIRE(zero == 0 || data_parallel >= 2,
                   "Train<Model, ...>: ZeRO<{}> shards model states over the data-parallel ranks, so it needs DataParallel<N> with N "
                   "at least 2 (N is {})",
                   zero, data_parallel);
  HEADROOM_REQUIRE(!update_in_backward || data_parallel == 1,
                   "Train<Model, ...>: UpdateInBackward updates each parameter inside its backward, before its gradient is averaged "
                   "over the {} data-parallel ranks; drop one of them",
                   data_parallel);
  // what the tensor-parallel ranks cannot split (layers/tensor_parallel.hpp)
  static constexpr tensor_parallel::Issue tp_issue = tensor_parallel::issue<M>(tensor_parallel);
  static constexpr std::int64_t tp_a = tp_issue.a, tp_b = tp_issue.b;
  HEADROOM_REQUIRE(tp_issue.kind != tensor_parallel::Issue::heads,
                   "Train<Model, TensorParallel<{}>>: each rank takes an equal share of the heads of every attention layer, but "
                   "{} query heads and {} KV heads do not both divide by {}",
                   tensor_parallel, tp_a, tp_b, tensor_parallel);
  HEADROOM_REQUIRE(tp_issue.kind != tensor_parallel::Issue::features,
                   "Train<Model, TensorParallel<{}>>: each rank takes an equal share of the hidden features of every feed-forward "
                   "layer, but {} do not divide by {}",
                   tensor_parallel, tp_a, tensor_parallel);
  HEADROOM_REQUIRE(tp_issue.kind != tensor_parallel::Issue::vocabulary,
                   "Train<Model, TensorParallel<{}>>: each rank takes an equal share of the vocabulary of the embedding and LM "
                   "head, but {} rows do not divide by {}; pad the vocabulary to a multiple of {}",
                   tensor_parallel, tp_a, tensor_parallel, tensor_parallel);
  HEADROOM_REQUIRE(!update_in_backward || tensor_parallel == 1 || !tensor_parallel::has_adapter<M>(),
                   "Train<Model, TensorParallel<{}>>: UpdateInBackward updates each parameter inside its backward, but each of "
                   "the {} ranks holds a partial gradient of a LoRA adapter matrix, summed after the backward; drop one of them",
                   tensor_parallel, tensor_parallel);
  HEADROOM_REQUIRE(!update_in_backward || tensor_parallel == 1 || !tensor_parallel::has_head_norm<M>(),
                   "Train<Model, TensorParallel<{}>>: UpdateInBackward updates each parameter inside its backward, but each of "
                   "the {} ranks holds a partial gradient of the q_norm / k_norm gains (from its share of the heads), summed "
                   "after the backward; drop one of them",
                   tensor_parallel, tensor_parallel);
  HEADROOM_REQUIRE(tp_issue.kind != tensor_parallel::Issue::quantized,
                   "Train<Model, TensorParallel<{}>>: quantized projections are not split over tensor-parallel ranks yet; use "
                   "DataParallel<N> alone",
                   tensor_parallel);
  // what the pipeline stages cannot divide (layers/pipeline_stages.hpp)
  static constexpr pipeline_stages::Issue pp_issue = pipeline_stages::issue<M>(pipeline_parallel);
  static constexpr std::int64_t pp_blocks = pp_issue.blocks;
  HEADROOM_REQUIRE(pp_issue.kind != pipeline_stages::Issue::no_repeat,
                   "Train<Model, PipelineParallel<{}>>: the stages divide the blocks of a Repeat of the model, and it has none",
                   pipeline_parallel);
  HEADROOM_REQUIRE(pp_issue.kind != pipeline_stages::Issue::runs,
                   "Train<Model, PipelineParallel<{}>>: the stages divide one Repeat of identical blocks, but the block selectors of "
                   "the model (Blocks, EveryKth, FirstBlocks) make its blocks {} runs of differing blocks; select with EveryBlock, "
                   "or train it without PipelineParallel",
                   pipeline_parallel, pp_blocks);
  HEADROOM_REQUIRE(pp_issue.kind != pipeline_stages::Issue::uneven,
                   "Train<Model, PipelineParallel<{}>>: each stage takes an equal share of the {} blocks of the model, which do not "
                   "divide by {}",
                   pipeline_parallel, pp_blocks, pipeline_parallel);
  HEADROOM_REQUIRE(!update_in_backward || pipeline_parallel == 1,
                   "Train<Model, ...>: UpdateInBackward updates each parameter inside its backward, but a pipeline stage runs the "
                   "backward of {} micro-batches before it may update; drop one of them",
                   accumulate);
  HEADROOM_REQUIRE(!offload_optimizer || !update_in_backward,
                   "Train<Model, OffloadOptimizer>: the host already updates each parameter as soon as its gradient reaches the "
                   "offload tier, so UpdateInBackward (the device's update inside backward) has nothing to do; drop it");
  HEADROOM_REQUIRE(!offload_params || offload_optimizer,
                   "Train<Model, OffloadParameters>: the parameters in the offload tier are updated there by the host, which "
                   "needs the optimizer there too; add OffloadOptimizer");
  HEADROOM_REQUIRE(detail::fits_context<M>(seq), "Train<Model, Seq<T>>: T ({}) exceeds the context length of the model ({})",
                   seq, detail::context_length<M>());

  static constexpr RunConfig config() {
    RunConfig c{};
    c.batch = batch;
    c.seq = seq;
    c.dtype = dtype;
    c.optim = optimizer::desc;
    c.accumulate = accumulate;
    c.update_in_backward = update_in_backward;
    c.offload_optimizer = offload_optimizer;
    c.offload_params = offload_params;
    c.workers = workers;
    c.loss_chunk = loss_chunk;
    c.engine = engine;
    c.dp = data_parallel;
    c.zero = zero;
    c.tp = tensor_parallel;
    c.pp = pipeline_parallel;
    c.stage = stage;
    return c;
  }
};

// Stage s of a pipelined run type: Run with its stage chosen, 0 .. S - 1.
template <class R, int S>
struct pipeline_stage_of;
template <class M, class... Options, int S>
struct pipeline_stage_of<Train<M, Options...>, S> {
  static constexpr int last = Train<M, Options...>::pipeline_parallel - 1;
  HEADROOM_REQUIRE(S >= 0 && S <= last, "pipeline_stage<Run, s>: s must be a stage of the run, 0 to {} (it is {})", last, S);
  using type = Train<M, Options..., detail::PipelineStage<S>>;
};
template <class R, int S>
using pipeline_stage = typename pipeline_stage_of<R, S>::type;

// The same model and step on one process: Run without its parallel layout
// (DataParallel, ZeRO, TensorParallel, PipelineParallel and a chosen stage
// dropped). Its plan names and shapes the whole model's parameters, as the
// exporters of a parallel run write them (io::Consolidated).
namespace detail {
template <class O>
inline constexpr bool layout_option = is_instance<O, DataParallel>::value || is_instance<O, ZeRO>::value ||
                                      is_instance<O, TensorParallel>::value || is_instance<O, PipelineParallel>::value ||
                                      is_instance<O, PipelineStage>::value;
template <class R, class... Kept>
struct without_layout;
template <class M, class... Kept>
struct without_layout<Train<M>, Kept...> {
  using type = Train<M, Kept...>;
};
template <class M, class O, class... Os, class... Kept>
struct without_layout<Train<M, O, Os...>, Kept...>
    : std::conditional_t<layout_option<O>, without_layout<Train<M, Os...>, Kept...>, without_layout<Train<M, Os...>, Kept..., O>> {};
}  // namespace detail
template <class R>
using single_process = typename detail::without_layout<R>::type;

template <class R>
concept TrainingRun = requires {
  typename R::model;
  { R::config() } -> std::same_as<RunConfig>;
};

}  // namespace headroom
