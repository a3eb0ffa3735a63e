// Data-parallel training jobs that go wrong on purpose, run under mpirun by
// tests/mpi/run_fault.cmake, which checks what every rank prints and that
// mpirun exits nonzero in bounded time (ctest mpi.trainer_*).
// trainer_faults <scenario>:
//   wrong-size   a run type of 2 data-parallel ranks started with another -np:
//                every rank reports the mismatch before anything trains
//   other-run    rank 0 is built for ZeRO 1, the others for ZeRO 2: every rank
//                reports that the ranks' run types differ
//   hang         the last rank stops (sleeps) in the middle of training: every
//                other rank's step fails with a communication error naming
//                itself and the collective, after the 3 s timeout
//   kill         the last rank SIGKILLs itself in the middle of training, after
//                a checkpoint was saved: the launcher stops the others, each
//                printing one line; the checkpoint is left whole (a later
//                ctest, trainer_resume_after_kill, loads it)
//   resume DIR   loads the checkpoint in DIR and trains a step from it
// Lines starting "headroom-test:" are this program's.
#include <headroom/headroom.hpp>
#include <headroom/host/mpi.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/host/trainer.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace headroom;

namespace {

constexpr models::LlamaConfig llama_fault{48, 64, 128, 2, 4, 2, 64, false};
template <int Stage>
using Run = Train<models::Llama<llama_fault>, Batch<2>, Seq<12>, AdamW, DataParallel<2>, ZeRO<Stage>>;
template <int N>
using RunOn = Train<models::Llama<llama_fault>, Batch<2>, Seq<12>, AdamW, DataParallel<N>, ZeRO<2>>;

std::vector<std::int32_t> ids(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((x >> 8) % 48);
  }
  return v;
}

template <class Tr>
double step(Tr& t) {
  const auto s = static_cast<std::uint32_t>(t.steps_done() + 1 + 100 * t.rank());
  return t.step(ids(Tr::tokens_per_step, s), ids(Tr::tokens_per_step, s + 7)).loss;
}

void say(const std::string& line) {
  std::printf("headroom-test: %s\n", line.c_str());
  std::fflush(stdout);
}

template <class Tr>
int construct_and_report(host::Communicator& c) {
  try {
    Tr t({}, c);
    say("FAILED: rank " + std::to_string(c.rank()) + " built its trainer");
    return 1;
  } catch (const host::communication_error& e) {
    say(e.what());
    return 1;
  }
}

int wrong_size(host::MpiCommunicator& c) { return construct_and_report<host::Trainer<Run<1>>>(c); }

int other_run(host::MpiCommunicator& c) {
  return c.rank() == 0 ? construct_and_report<host::Trainer<Run<1>>>(c) : construct_and_report<host::Trainer<Run<2>>>(c);
}

template <int N>
int hang(host::MpiCommunicator& c) {
  host::Trainer<RunOn<N>> t({}, c);
  step(t);
  if (c.rank() == N - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // stops participating; the launcher ends it
    return 0;
  }
  try {
    for (int s = 0; s < 5; ++s) step(t);
    say("FAILED: rank " + std::to_string(c.rank()) + " trained without the last rank");
  } catch (const host::communication_error& e) {
    say(e.what());
  }
  return 1;
}

template <int N>
int kill(host::MpiCommunicator& c, const std::string& dir) {
  host::Trainer<RunOn<N>> t({}, c);
  step(t);
  step(t);
  io::save_checkpoint(t, dir);
  step(t);
  if (c.rank() == N - 1) {
    say("killed at " + std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()));
    ::kill(::getpid(), SIGKILL);
  }
  for (;;) step(t);  // until the launcher stops this rank
}

template <int N>
int resume(host::MpiCommunicator& c, const std::string& dir) {
  host::Trainer<RunOn<N>> t({.seed = 99}, c);
  io::load_checkpoint(t, dir);
  if (t.steps_done() != 2) {
    say("FAILED: the checkpoint holds step " + std::to_string(t.steps_done()));
    return 1;
  }
  const double loss = step(t);
  if (c.rank() == 0) say("resumed at step 2 from the checkpoint saved before the kill; step 3 loss " + std::to_string(loss));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  const std::string dir = argc > 2 ? argv[2] : "";
  host::MpiCommunicator c(std::chrono::seconds(3));
  if (scenario == "wrong-size") return wrong_size(c);
  if (scenario == "other-run") return other_run(c);
  const bool four = c.size() == 4;
  if (scenario == "hang") return four ? hang<4>(c) : hang<2>(c);
  if (scenario == "kill") return four ? kill<4>(c, dir) : kill<2>(c, dir);
  if (scenario == "resume") return four ? resume<4>(c, dir) : resume<2>(c, dir);
  say("FAILED: unknown scenario '" + scenario + "'");
  return 2;
}
