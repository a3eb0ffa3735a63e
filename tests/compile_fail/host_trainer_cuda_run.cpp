// A run planned for the CUDA engine cannot train on the host: its plan holds
// the cuBLASLt workspace and the CUDA kernels' scratch, not the host's panels.
// expect: host::Trainer<Run>: the run is planned for the CUDA engine (OnCuda)
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<32>, OnCuda>;
host::Trainer<R> t({});
