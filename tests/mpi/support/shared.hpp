#pragma once
// What several MPI tests share: a directory every rank names the same, and
// the largest difference between two safetensors files.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include <catch2/catch.hpp>

#include <headroom/host/communicator.hpp>
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

}  // namespace headroom::test
