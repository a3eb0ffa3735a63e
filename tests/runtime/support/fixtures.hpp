#pragma once
// Helpers the runtime tests share: a scratch directory, deterministic token
// ids, a file writer, and a comparison that reports one index.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace headroom::test {

// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path dir;
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    dir = std::filesystem::temp_directory_path() / ("headroom_test_" + std::to_string(::getpid()) + "_" +
                                                    std::to_string(stamp) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return dir / name; }
};

// Writes `bytes` to `path`, replacing it.
inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// n token ids in [0, vocab) from a seeded linear congruential generator.
inline std::vector<std::int32_t> ids(std::size_t n, std::uint32_t seed, int vocab = 48) {
  std::vector<std::int32_t> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::int32_t>((x >> 8) % static_cast<std::uint32_t>(vocab));
  }
  return v;
}

// -1 when equal, else the first index where they differ (a failed check then
// prints one number, not two large vectors).
template <class V>
long mismatch_at(const V& a, const V& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i)
    if (!(a[i] == b[i])) return static_cast<long>(i);
  return a.size() == b.size() ? -1 : static_cast<long>(n);
}

// A learnable stream of n tokens in [0, 64) and their next-token targets:
// mostly a fixed bigram map, sometimes mixing in the token two back.
struct Stream {
  std::vector<std::int32_t> tok, tgt;
  explicit Stream(std::size_t n, std::uint32_t seed) : tok(n), tgt(n) {
    std::vector<std::int32_t> s(n + 1);
    s[0] = static_cast<std::int32_t>(seed % 64);
    s[1] = static_cast<std::int32_t>((seed / 64) % 64);
    for (std::size_t i = 2; i <= n; ++i) s[i] = (s[i - 1] * 5 + 1 + (i % 7 == 0 ? s[i - 2] : 0)) % 64;
    for (std::size_t i = 0; i < n; ++i) {
      tok[i] = s[i];
      tgt[i] = s[i + 1];
    }
  }
};

}  // namespace headroom::test
