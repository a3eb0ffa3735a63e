// A data-parallel run's CUDA trainer is one rank: it needs the ranks' communicator.
// expect: cuda::Trainer: a run with DataParallel<N> or TensorParallel<N> trains one rank of several; construct it with the ranks' communicator
#include "../../cuda/emulator/cuda_emulator.hpp"
#include "../../cuda/emulator/runtime_emulator.hpp"

#include <headroom/headroom.hpp>
#include <headroom/train/cuda/trainer.cuh>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, OnCuda, DataParallel<2>, ZeRO<1>>;
cuda::Trainer<R> t({});
