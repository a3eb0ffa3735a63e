// The spellings of a trainer's options: `host::Trainer<R> t({})` (the
// defaults), `t({.lr = ...})` and `t(TrainOptions{})`. The constructor takes
// its options without a default argument, so that empty braces can only be
// TrainOptions (with a default argument they would equally make a Trainer,
// for the copy and move constructors, and g++ called t({}) ambiguous).
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>

#include <concepts>

namespace {
using namespace headroom;

using OptionsRun = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<16>>;
using T = host::Trainer<OptionsRun>;

template <class X>
concept from_designated = requires { X({.lr = 1e-3, .warmup_steps = 10}); };
template <class X>
concept from_options = requires { X(TrainOptions{}); };
template <class X>
concept from_empty_braces = requires { X({}); };

static_assert(from_designated<T>, "host::Trainer<R> t({.lr = ...}): the spelling of every doc page");
static_assert(from_options<T>, "host::Trainer<R> t(TrainOptions{})");
static_assert(from_empty_braces<T>, "host::Trainer<R> t({}): the default options");
}  // namespace
