// A pipeline stage's CUDA trainer trains with the other stages: it needs the communicator of every process.
// expect: cuda::Trainer: a pipeline stage trains with the other stages; construct it with the communicator of every process of the run
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, Accumulate<2>, OnCuda, PipelineParallel<2>>;
cuda::Trainer<pipeline_stage<R, 0>> t({});
