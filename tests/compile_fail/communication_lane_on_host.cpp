// An op on the communication lane (a collective) in a run of the host
// engine without data-parallel ranks: it has no communicator to run on.
#include <headroom/train/host/trainer.hpp>

#include "../runtime/support/twice_op.hpp"

using namespace headroom;
using R = Train<test_lanes::TwiceModel<ops::Lane::communication>, Batch<1>, Seq<8>>;
host::Trainer<R> t({});

// expect-gcc: host::Trainer: the op twice of layer Twice runs on the communication lane, which needs the ranks of a data-parallel run (DataParallel<N> with N at least 2; this run has 1)
// expect-clang: runs on the communication lane, which needs the ranks of a data-parallel run
