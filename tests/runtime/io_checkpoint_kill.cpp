// A save killed at a random point: a child process saves checkpoints in a
// loop (alternating two trainers' states) and is SIGKILLed, 40 times, a
// random time after a random number (0 to 3) of its saves completed; the
// child reports each completed save through a pipe, so the kills cover both
// states however slowly the machine runs. After each kill the checkpoint directory must load, hold
// exactly one of the two saved states, and resume bit-identically to a run
// that was never interrupted; the next save cleans up what the kill left.
#include <catch2/catch.hpp>

#include "support/fixtures.hpp"

#include <headroom/headroom.hpp>
#include <headroom/io/checkpoint.hpp>
#include <headroom/train/host/trainer.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace headroom;

namespace {
namespace fs = std::filesystem;
using headroom::test::ids;
using headroom::test::mismatch_at;
using headroom::test::TempDir;

constexpr models::LlamaConfig llama_kill{48, 64, 128, 2, 4, 2, 64, false};
using KillRun = Train<models::Llama<llama_kill>, Batch<2>, Seq<12>, Precision<DType::F32>, AdamW8bit>;
using Tr = host::Trainer<KillRun>;

host::TrainOptions options(std::uint64_t seed) { return {.seed = seed, .lr = 1e-2, .warmup_steps = 2, .total_steps = 8}; }

double step(Tr& t) {
  const auto s = static_cast<std::uint32_t>(t.steps_done() + 1);
  return t.step(ids(24, 10 * s), ids(24, 10 * s + 1)).loss;
}

// Parameters as stored and optimizer states: every byte a step reads.
std::vector<unsigned char> state_bytes(const Tr& t) {
  std::vector<unsigned char> out;
  for (std::size_t k = 0; k < Tr::param_count; ++k) {
    const ParamSlot& p = Tr::param(k);
    const auto* w = reinterpret_cast<const unsigned char*>(t.weight(p));
    out.insert(out.end(), w, w + p.elements() * static_cast<std::int64_t>(sizeof(float)));
    const auto* s = reinterpret_cast<const unsigned char*>(t.state(p));
    out.insert(out.end(), s, s + Tr::config.optim.state_bytes(p.elements()));
  }
  return out;
}
// The entries of a directory, by name: a save's staging directory
// ("ckpt.headroom-saving-<random>") or the old checkpoint it set aside
// ("ckpt.headroom-old-<random>") beside "ckpt" when a save was cut short.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

TEST_CASE("checkpoint: a save killed at a random point leaves a checkpoint that resumes bit-identically", "[io][checkpoint][kill]") {
  TempDir tmp;
  const fs::path dir = tmp / "ckpt";

  Tr straight(options(1));
  std::vector<double> losses;
  std::vector<std::vector<unsigned char>> states{state_bytes(straight)};  // states[s]: after s steps
  for (int s = 0; s < 6; ++s) {
    losses.push_back(step(straight));
    states.push_back(state_bytes(straight));
  }
  Tr at3(options(1)), at4(options(1));
  for (int s = 0; s < 3; ++s) step(at3);
  for (int s = 0; s < 4; ++s) step(at4);

  // how long one save takes here: the kills land over about three of them
  io::save_checkpoint(at3, dir);
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 3; ++k) io::save_checkpoint(k % 2 ? at3 : at4, dir);
  const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count() / 3;
  io::save_checkpoint(at3, dir);

  std::mt19937 rng(20261201);
  std::uniform_int_distribution<int> saves_before(0, 3);
  std::uniform_int_distribution<long> delay_us(0, std::max<long>(save_us, 200));
  int left_behind = 0;  // kills that left a staging or set-aside directory (or no ckpt): a save was cut short
  int seen[2] = {0, 0};
  for (int kill = 0; kill < 40; ++kill) {
    int done[2];  // the child writes one byte per completed save
    REQUIRE(::pipe(done) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(done[0]);
      try {
        for (int k = 0;; ++k) {
          io::save_checkpoint(k % 2 ? at3 : at4, dir);
          const char one = 1;
          if (::write(done[1], &one, 1) != 1) break;
        }
      } catch (...) {
      }
      ::_exit(3);  // a save failed: the parent sees this exit instead of its SIGKILL
    }
    ::close(done[1]);
    for (int n = saves_before(rng); n > 0; --n) {
      char byte = 0;
      REQUIRE(::read(done[0], &byte, 1) == 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    ::close(done[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    if (entries(tmp.dir) != std::vector<std::string>{"ckpt"}) ++left_behind;

    Tr resumed(options(99));
    io::load_checkpoint(resumed, dir);
    const int s = resumed.steps_done();
    REQUIRE((s == 3 || s == 4));
    ++seen[s - 3];
    REQUIRE(mismatch_at(state_bytes(resumed), states[static_cast<std::size_t>(s)]) == -1);
    while (resumed.steps_done() < 6) {
      const double loss = step(resumed);
      REQUIRE(loss == losses[static_cast<std::size_t>(resumed.steps_done() - 1)]);
    }
    REQUIRE(mismatch_at(state_bytes(resumed), states[6]) == -1);
  }
  // The kills did cut saves short, and both states were found afterwards.
  CHECK(left_behind > 0);
  CHECK(seen[0] > 0);
  CHECK(seen[1] > 0);

  io::save_checkpoint(at4, dir);  // recovers whatever the last kill left
  CHECK(entries(tmp.dir) == std::vector<std::string>{"ckpt"});
  Tr last(options(5));
  io::load_checkpoint(last, dir);
  CHECK(last.steps_done() == 4);
}
