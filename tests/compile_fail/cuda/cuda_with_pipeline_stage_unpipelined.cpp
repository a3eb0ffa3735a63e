// cuda::with_pipeline_stage chooses the stage of a pipelined run type; a run without PipelineParallel has none.
// expect: cuda::with_pipeline_stage<Run>: Run must be a PipelineParallel<S> run type, its stage not chosen
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, DataParallel<2>>;
void run(cuda::Communicator& comm) {
  cuda::with_pipeline_stage<R>(comm, []<class Stage>() {});
}
