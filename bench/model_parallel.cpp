// Tensor- and pipeline-parallel training speed against one process, one
// layout per run (started under mpirun, or alone for one process): a
// Llama-shaped model (width 512, MLP 1,536, 4 layers, 8 heads, a
// vocabulary of 4,096 that divides over the ranks, untied head so that it
// can be staged), full training with AdamW, Batch<4> x Seq<128> x
// Accumulate<4> per step (the pipeline's micro-batches), one thread per
// process, pseudo-random tokens. Prints the tokens/s of the timed steps
// (rank 0).
//
//   model_parallel_bench one [--steps K]                  (one process: the baseline)
//   mpirun -np 2 model_parallel_bench tensor [--steps K]  (TensorParallel<2>)
//   mpirun -np 2 model_parallel_bench pipeline [--steps K] (PipelineParallel<2>, 1F1B)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/train/host/trainer.hpp>
#include <string>
#include <vector>

using namespace headroom;

namespace {

constexpr models::LlamaConfig shape{4096, 512, 1536, 4, 8, 8, 256, false};
using Model = models::Llama<shape>;
template <class... Layout>
using Run = Train<Model, Batch<4>, Seq<128>, Accumulate<4>, AdamW, Layout...>;

std::vector<std::int32_t> ids(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> v(n);
  std::uint32_t x = seed;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((x >> 9) % shape.vocab);
  }
  return v;
}

// tokens/s over `steps` steps after one warm-up step
template <class Tr>
double tokens_per_second(Tr& t, int steps) {
  const auto tokens = ids(Tr::tokens_per_step, 1), targets = ids(Tr::tokens_per_step, 2);
  t.step(tokens, targets);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) t.step(tokens, targets);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(steps) * static_cast<double>(Tr::tokens_per_step) / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string layout = argc > 1 ? argv[1] : "one";
  const int steps = argc > 3 && std::strcmp(argv[2], "--steps") == 0 ? std::atoi(argv[3]) : 4;
  const host::TrainOptions options{.threads = 1};
  if (layout == "one") {
    host::Trainer<Run<>> t(options);
    std::printf("{\"layout\": \"one\", \"processes\": 1, \"tokens_per_second\": %.1f}\n", tokens_per_second(t, steps));
    return 0;
  }
  host::MpiCommunicator comm;
  double rate = 0;
  if (layout == "tensor") {
    host::Trainer<Run<TensorParallel<2>>> t(options, comm);
    rate = tokens_per_second(t, steps);
  } else if (layout == "pipeline") {
    host::with_pipeline_stage<Run<PipelineParallel<2>>>(comm, [&]<class Stage>() {
      host::Trainer<Stage> t(options, comm);
      rate = tokens_per_second(t, steps);
    });
  } else {
    std::fprintf(stderr, "model_parallel_bench: the layout is one, tensor or pipeline, not '%s'\n", layout.c_str());
    return 2;
  }
  if (comm.rank() == 0)
    std::printf("{\"layout\": \"%s\", \"processes\": %d, \"tokens_per_second\": %.1f}\n", layout.c_str(), comm.size(), rate);
  return 0;
}
