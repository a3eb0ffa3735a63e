// The CUDA engine offloads (OffloadOptimizer, OffloadParameters) for one process; a parallel layout with them runs on the host engine.
// expect: cuda::Trainer<Run>: OffloadOptimizer (and OffloadParameters) with DataParallel, TensorParallel or PipelineParallel runs on the host engine only so far
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, OffloadOptimizer, OffloadParameters, DataParallel<2>, ZeRO<1>>;
cuda::Trainer<R>* make(cuda::Communicator& comm) { return new cuda::Trainer<R>({}, comm); }
