// A data-parallel run's trainer is one rank: it needs the ranks' communicator.
// expect: host::Trainer: a run with DataParallel<N> or TensorParallel<N> trains one rank of several; construct it with the ranks' communicator
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>, DataParallel<2>, ZeRO<1>>;
host::Trainer<R> t({});
