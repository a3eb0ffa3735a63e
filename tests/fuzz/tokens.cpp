// libFuzzer target: token files (io/dataset.hpp), the ids a training run
// reads, as TokenFile maps them and TokenDataset splits them.
//
// The input's bytes are written to a file and opened. A file that is refused
// must be refused with data_error; one that is read must keep the reader's
// promises:
//   - TokenFile: 2- or 4-byte elements, a vocab size of at least 1 that
//     2-byte elements can hold, and exactly 24 + size() * element_size()
//     bytes; operator[] and copy() agree;
//   - TokenDataset (validation fraction 1/2): every id lies in [0, vocab);
//     the unigram baseline is finite and not negative; training and
//     validation windows hold the file's tokens, targets shifted by one.
// What either takes is bounded by the file: the sanitizers' allocator fails
// the target on an allocation the input does not back.
#include <headroom/io/dataset.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace {

[[noreturn]] void broken(const char* what, int line) {
  std::fprintf(stderr, "fuzz tokens: a promise of the token file reader is broken (line %d): %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond) \
  do {                   \
    if (!(cond)) broken(#cond, __LINE__); \
  } while (0)

// One file per process, rewritten for each input, removed at exit.
const std::filesystem::path& input_path() {
  static const std::filesystem::path p = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove(input_path(), ec);
    });
    return std::filesystem::temp_directory_path() / ("headroom-fuzz-tokens-" + std::to_string(::getpid()) + ".tok");
  }();
  return p;
}

void write_input(const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(input_path().c_str(), "wb");
  if (!f) broken("cannot write the input file", __LINE__);
  if (size && std::fwrite(data, 1, size, f) != size) broken("cannot write the input file", __LINE__);
  std::fclose(f);
}

void check_dataset(headroom::io::TokenFile file) {
  using headroom::io::TokenDataset;
  const std::size_t n = file.size();
  const std::uint32_t vocab = file.vocab_size();
  std::vector<std::int32_t> ids(n);
  file.copy(0, n, ids.data());
  TokenDataset ds(std::move(file), 0.5, 1);
  for (const std::int32_t id : ids) FUZZ_CHECK(id >= 0 && static_cast<std::uint64_t>(id) < vocab);
  FUZZ_CHECK(std::isfinite(ds.unigram_loss()) && ds.unigram_loss() >= 0);
  FUZZ_CHECK(ds.train_size() + ds.validation_size() == n);
  if (ds.train_size() >= 2) {
    std::int32_t tokens[2], targets[2];
    ds.next_batch(tokens, targets, 2, 1);
    for (int b = 0; b < 2; ++b) {
      bool found = false;  // some training position o with ids[o] = token, ids[o + 1] = target
      for (std::size_t o = 0; o + 1 < ds.train_size() && !found; ++o) found = ids[o] == tokens[b] && ids[o + 1] == targets[b];
      FUZZ_CHECK(found);
    }
  }
  if (ds.validation_size() >= 2) {
    const auto batches = ds.validation_batches(1, 1);
    for (std::size_t i = 0; i < batches.size() && i < 64; ++i) {
      std::int32_t token = 0, target = 0;
      batches.fill(i, &token, &target);
      FUZZ_CHECK(token == ids[ds.train_size() + i] && target == ids[ds.train_size() + i + 1]);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using headroom::io::data_error;
  using headroom::io::TokenFile;
  write_input(data, size);
  try {
    TokenFile file(input_path());
    const std::uint32_t esize = file.element_size();
    FUZZ_CHECK(esize == 2 || esize == 4);
    FUZZ_CHECK(file.vocab_size() >= 1 && (esize == 4 || file.vocab_size() <= 65536));
    FUZZ_CHECK(24 + file.size() * esize == size);
    std::vector<std::int32_t> copied(file.size());
    file.copy(0, file.size(), copied.data());
    for (std::size_t i = 0; i < file.size(); ++i) FUZZ_CHECK(copied[i] == file[i]);
    try {
      check_dataset(std::move(file));
    } catch (const data_error&) {
      // an id outside the vocabulary, or too few tokens to split: refused, with its reason
    }
  } catch (const data_error&) {
    // refused, with its reason
  }
  return 0;
}
