// A pipelined run's CUDA trainer trains one stage: it is built for pipeline_stage<Run, s>.
// expect: cuda::Trainer<Run>: a PipelineParallel<S> run trains stage by stage: cuda::Trainer<pipeline_stage<Run, s>> (cuda::with_pipeline_stage chooses this process's stage)
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Accumulate<2>, OnCuda, PipelineParallel<2>>;
constexpr auto n = sizeof(cuda::Trainer<R>);
