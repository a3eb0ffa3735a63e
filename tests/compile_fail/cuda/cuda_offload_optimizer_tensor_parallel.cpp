// The CUDA engine runs OffloadOptimizer on one process or data-parallel ranks; with tensor (or pipeline) parallelism it runs on the host engine.
// expect: cuda::Trainer<Run>: OffloadOptimizer with TensorParallel or PipelineParallel runs on the host engine only so far; on the CUDA engine it trains one process or DataParallel<N> ranks
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, OffloadOptimizer, TensorParallel<2>>;
cuda::Trainer<R>* make(cuda::Communicator& comm) { return new cuda::Trainer<R>({}, comm); }
