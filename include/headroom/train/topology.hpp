#pragma once
// The processes of a parallel run as groups, for both engines' trainers.
//
// A run of PipelineParallel<S> x DataParallel<N> x TensorParallel<M>
// processes joins them all in one communicator, the world. Process
//
//   w = (stage N + d) M + t
//
// is tensor-parallel rank t of data-parallel rank d of pipeline stage
// `stage`: the tensor-parallel ranks of a group are neighbours, as a
// launcher places them on one node. join_world checks the world against
// the run type (its size; on every process the same run type and seed, on
// each stage's processes the same schedule) and splits it into the groups
// a step talks to. Comm is host::Communicator or cuda::Communicator, which
// share check_size, agree and split.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "../layers/pipeline_stages.hpp"
#include "../plan/schedule.hpp"
#include "../run.hpp"

namespace headroom::trainers {

template <class Comm>
struct Topology {
  Comm* world = nullptr;   // every process of the run (null: one process)
  Comm* data = nullptr;    // this process's data-parallel ranks (null: one)
  Comm* tensor = nullptr;  // its tensor-parallel group (null without one)
  Comm* pipe = nullptr;    // its pipeline stages, ranked by stage (null without)
  Comm* shared = nullptr;  // the first and the last stage, with a tied LM head (null without)
  std::unique_ptr<Comm> data_group, tensor_group, pipe_group, shared_group;  // split from the world

  int data_rank() const { return data != nullptr ? data->rank() : 0; }
  int tensor_rank() const { return tensor != nullptr ? tensor->rank() : 0; }
  int world_rank() const { return world != nullptr ? world->rank() : 0; }
};

// Pipeline parallelism with an LM head tied to the embedding table
// (layers/pipeline_stages.hpp): the first stage holds the table, the last a
// copy; before the update both add the other's gradient of it to their own
// (ParamSlot::stage_shared; the whole gradient, with ZeRO 2 and 3 this
// rank's shard of it), and the gradient norm counts it on the first stage
// alone. With more than 2 stages the pair of process w (data-parallel rank
// d, tensor-parallel rank t) is a group split from the world by this
// color; with 2 it is the stages' own communicator.
template <class R>
inline constexpr bool tied_stages = R::config().pp > 1 && pipeline_stages::tied_head<typename R::model>();
constexpr int tied_stages_color(const RunConfig& c, int w) {
  const int t = w % c.tp, d = (w / c.tp) % c.dp, stage = w / (c.tp * c.dp);
  return stage == 0 || stage == c.pp - 1 ? d * c.tp + t : c.dp * c.tp + w;  // the middle stages: each alone
}

// Checks `world` (null: one process) against run R, whose schedule (R's own,
// or its stage's) is `sched`, and the seed; then splits it into groups.
// `engine` ("host::Trainer") begins the errors. Every check is a collective:
// each process of the run calls this, or each throws the same error.
template <TrainingRun R, class Comm, class Sched>
Topology<Comm> join_world(std::string_view engine, Comm* world, const Sched& sched, std::uint64_t seed) {
  constexpr RunConfig config = R::config();
  Topology<Comm> g;
  g.world = world;
  g.data = world;
  if (world == nullptr) return g;
  if constexpr (config.tp == 1 && config.pp == 1)
    world->check_size(config.dp, "data-parallel ranks");
  else
    world->check_size(config.world(), "ranks (" + (config.pp > 1 ? std::to_string(config.pp) + " pipeline stages x " : std::string()) +
                                          std::to_string(config.dp) + " data-parallel x " + std::to_string(config.tp) +
                                          " tensor-parallel)");
  if constexpr (config.pp > 1) {  // every process: the same run type; each stage's processes: the same schedule (below)
    world->agree(headroom::fingerprint_of_run(config), "the hash of the pipelined run type");
    const int stage = world->rank() / (config.dp * config.tp);
    if (stage != config.stage) {
      const std::string prefix(engine.substr(0, engine.find("::")));
      throw std::invalid_argument(std::string(engine) + ": " + world->who() + " is pipeline stage " + std::to_string(stage) +
                                  " (process w is stage w / " + std::to_string(config.dp * config.tp) +
                                  "), but this trainer's run type is stage " + std::to_string(config.stage) + "; choose the stage with " +
                                  prefix + "::with_pipeline_stage");
    }
  } else {
    world->agree(headroom::fingerprint(sched), "the hash of the run type's schedule");
  }
  world->agree(seed, "the seed");
  if constexpr (config.tp == 1 && config.pp == 1) return g;
  const int w = world->rank(), t = w % config.tp, d = (w / config.tp) % config.dp, stage = w / (config.tp * config.dp);
  g.data = nullptr;
  if constexpr (config.tp > 1) {
    g.tensor_group = world->split(w / config.tp, t);
    g.tensor = g.tensor_group.get();
  }
  if constexpr (config.dp > 1) {
    g.data_group = world->split(stage * config.tp + t, d);
    g.data = g.data_group.get();
  }
  if constexpr (config.pp > 1) {
    g.pipe_group = world->split(d * config.tp + t, stage);
    g.pipe = g.pipe_group.get();
    // a stage's processes are its tensor- and data-parallel groups together
    if (g.tensor != nullptr) g.tensor->agree(headroom::fingerprint(sched), "the hash of the stage's schedule");
    if (g.data != nullptr) g.data->agree(headroom::fingerprint(sched), "the hash of the stage's schedule");
  }
  if constexpr (tied_stages<R> && config.pp > 2) g.shared_group = world->split(tied_stages_color(config, w), stage);
  if constexpr (tied_stages<R>) g.shared = config.pp > 2 ? g.shared_group.get() : g.pipe;
  return g;
}

}  // namespace headroom::trainers
