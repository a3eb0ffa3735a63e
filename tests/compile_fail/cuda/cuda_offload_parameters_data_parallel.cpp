// The CUDA engine runs OffloadOptimizer on data-parallel ranks, but OffloadParameters on one process only; a data-parallel run with it runs on the host engine.
// expect: cuda::Trainer<Run>: OffloadParameters with DataParallel runs on the host engine only so far; on the CUDA engine it trains one process
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/cuda/trainer.cuh>
#include <headroom/headroom.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, OffloadOptimizer, OffloadParameters, DataParallel<2>, ZeRO<1>>;
cuda::Trainer<R>* make(cuda::Communicator& comm) { return new cuda::Trainer<R>({}, comm); }
