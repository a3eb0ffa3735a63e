// An op on the communication lane (a collective) in a run of the host
// engine, which runs the compute and host-threads lanes only.
#include <headroom/host/trainer.hpp>

#include "../runtime/support/twice_op.hpp"

using namespace headroom;
using R = Train<test_lanes::TwiceModel<ops::Lane::communication>, Batch<1>, Seq<8>>;
host::Trainer<R> t({});

// expect-gcc: host::Trainer: the op twice of layer Twice runs on the communication lane, which the host engine does not run
// expect-clang: runs on the communication lane, which the host engine does not run
