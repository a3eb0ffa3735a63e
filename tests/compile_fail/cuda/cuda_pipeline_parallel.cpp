// Pipeline parallelism does not run on the CUDA engine yet: the trainer says so.
// expect: cuda::Trainer: PipelineParallel<S> does not run on the CUDA engine yet (pipe_recv / pipe_send have no CUDA kernels); train it with host::Trainer
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Accumulate<2>, OnCuda, PipelineParallel<2>>;
cuda::Trainer<pipeline_stage<R, 0>> t({});
