// A pipelined run's trainer trains one stage: it is built for pipeline_stage<Run, s>.
// expect: schedule<Run>: a pipelined run is scheduled stage by stage: schedule<pipeline_stage<Run, s>>() (host::Trainer of a stage: host::with_pipeline_stage)
#include <headroom/headroom.hpp>
#include <headroom/train/host/trainer.hpp>
using namespace headroom;

using R = Train<models::Llama<models::tiny_llama>, Batch<1>, Seq<64>, Accumulate<4>, PipelineParallel<2>>;
constexpr auto n = sizeof(host::Trainer<R>);
