#pragma once
// What several MPI tests share: a directory every rank names the same, the
// largest difference between two safetensors files, and the check that a
// consolidated export equals the one-process file.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include <headroom/host/communicator.hpp>
#include <headroom/io/consolidated.hpp>
#include <headroom/io/hf_names.hpp>
#include <headroom/io/safetensors.hpp>

#include "../../runtime/support/fixtures.hpp"

namespace headroom::test {

// One directory every rank names the same: rank 0's (removed with it).
struct SharedDir {
  std::unique_ptr<TempDir> own;
  std::filesystem::path path;
  explicit SharedDir(host::Communicator& c) {
    char name[512] = {};
    std::vector<char> all(sizeof name * static_cast<std::size_t>(c.size()));
    if (c.rank() == 0) {
      own = std::make_unique<TempDir>();
      std::strncpy(all.data(), own->dir.c_str(), sizeof name - 1);
    }
    c.all_gather(all.data(), sizeof name);
    path = std::filesystem::path(all.data());
  }
};

// The largest difference between the tensors of two safetensors files,
// which must have the same names and shapes.
inline double file_difference(const std::filesystem::path& x, const std::filesystem::path& y) {
  const io::SafetensorsFile a(x), b(y);
  REQUIRE(a.tensors().size() == b.tensors().size());
  double worst = 0;
  for (const io::TensorInfo& t : a.tensors()) {
    const io::TensorInfo* u = b.find(t.name);
    REQUIRE(u != nullptr);
    REQUIRE(u->shape == t.shape);
    std::int64_t n = 1;
    for (const std::int64_t e : t.shape) n *= e;
    std::vector<float> va(static_cast<std::size_t>(n)), vb(va.size());
    io::read_converted<float>(a, t, std::span<float>(va));
    io::read_converted<float>(b, *u, std::span<float>(vb));
    for (std::size_t i = 0; i < va.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(va[i] - vb[i])));
  }
  return worst;
}

// io::Consolidated of a parallel trainer (every process calls it): the file
// its save_pretrained writes equals the one-process trainer's.
template <class Tr, class One>
void saves_like_one_process(host::Communicator& c, const SharedDir& dir, const Tr& t, const One& one) {
  const io::Consolidated<Tr> full(t);
  static_assert(io::Consolidated<Tr>::param_count == One::param_count);
  if (c.rank() == 0) {
    io::save_pretrained(full, dir.path / "parallel.safetensors");
    io::save_pretrained(one, dir.path / "one.safetensors");
    CHECK(file_difference(dir.path / "parallel.safetensors", dir.path / "one.safetensors") < 1e-6);
  }
  c.barrier();
}

// Every parameter this process stores, and its optimizer state, bit-identical
// in two trainers of the same layout (one of them with its model states
// offloaded): dense values (with ZeRO 3 this rank's shard) or quantized codes.
template <class A, class B>
void check_same_parameters(const A& a, const B& b) {
  static_assert(A::param_count == B::param_count);
  for (std::size_t k = 0; k < A::param_count; ++k) {
    const ParamSlot &p = A::param(k), &q = B::param(k);
    INFO(A::path_of(p));
    REQUIRE(A::path_of(p) == B::path_of(q));
    const auto n = static_cast<std::size_t>(a.shard_of(p).count);
    if (p.quant.kind == QuantKind::none)
      CHECK(std::memcmp(a.weight(p), b.weight(q), (A::config.sharded(3) ? n : static_cast<std::size_t>(p.elements())) * 4) == 0);
    if (p.state >= 0) CHECK(std::memcmp(a.state(p), b.state(q), static_cast<std::size_t>(A::config.optim.state_bytes(n))) == 0);
  }
}

// Two trainers of the same layout, one with its model states offloaded
// (Off), built with options o and clip_norm 0 and `clip`, each trained 10
// steps with step(trainer, s) (s = 1..10; the same batches for both): the
// same losses and norms every step, then the same parameters and states.
template <class Dev, class Off, class StepFn>
void trains_like_the_device(host::Communicator& c, host::TrainOptions o, double clip, StepFn step) {
  static_assert(Off::plan.bytes(Role::optimizer_state, Tier::device) == 0);
  for (const double clip_norm : {0.0, clip}) {
    o.clip_norm = clip_norm;
    Dev dev(o, c);
    Off off(o, c);
    for (int s = 1; s <= 10; ++s) {
      const host::StepStats x = step(dev, s), y = step(off, s);
      INFO("step " << s << ", clip_norm " << clip_norm << ", rank " << c.rank());
      CHECK(x.loss == y.loss);
      CHECK(x.grad_norm == y.grad_norm);
    }
    check_same_parameters(dev, off);
  }
}

}  // namespace headroom::test
