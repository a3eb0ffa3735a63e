// The CUDA engine runs OffloadParameters over data-parallel ranks with ZeRO 3 (or 0), where each rank stores what it updates; with ZeRO 2 the updated blocks would have to travel between the ranks' pinned memory.
// expect: cuda::Trainer<Run>: OffloadParameters with ZeRO<1> or ZeRO<2> runs on the host engine only
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, OffloadOptimizer, OffloadParameters, DataParallel<2>, ZeRO<2>>;
cuda::Trainer<R>* make(cuda::Communicator& comm) { return new cuda::Trainer<R>({}, comm); }
