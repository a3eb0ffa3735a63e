// GPT-2's byte-level BPE (io::Gpt2Bpe) on GPT-2's own files: encode
// throughput in input bytes per second.
//
//   scripts/fetch-corpus --gpt2-bpe        # data/corpus/{austen,kjv}.txt, data/corpus/gpt2/
//   build/bench/tokenizer                                   everything
//   build/bench/tokenizer --benchmark_filter='text'         the two books only
//
//   tokenizer/text/austen            Austen's novels (4.0 MB), one encode() call
//   tokenizer/text/kjv               the King James Bible (4.1 MB), one encode() call
//   tokenizer/spacefree/<bytes>      only the letters of Austen, in order, repeated
//                                    to <bytes>: one pre-tokenization piece of
//                                    <bytes> bytes (" ?\p{L}+"), BPE's worst case
//                                    for an algorithm quadratic in a piece's length
//   tokenizer/run/<bytes>            <bytes> times 'a': one piece, GPT-2's merges of
//                                    a, aa, aaaa, ... (overlapping pairs everywhere)
//
// The files are looked up in $HEADROOM_CORPUS_DIR, else in data/corpus of this
// checkout; a benchmark whose files are missing reports an error naming the
// command that fetches them.
#include <benchmark/benchmark.h>

#include <headroom/io/tokenizer.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

namespace {

namespace fs = std::filesystem;
using headroom::io::Gpt2Bpe;

fs::path corpus_dir() {
  if (const char* env = std::getenv("HEADROOM_CORPUS_DIR")) return env;
  return fs::path(__FILE__).parent_path() / ".." / "data" / "corpus";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The tokenizer, loaded once; null (and `why` set) when the files are missing.
const Gpt2Bpe* tokenizer(std::string& why) {
  static std::string error;
  static const std::unique_ptr<Gpt2Bpe> bpe = []() -> std::unique_ptr<Gpt2Bpe> {
    try {
      return std::make_unique<Gpt2Bpe>(corpus_dir() / "gpt2");
    } catch (const std::exception& e) {
      error = e.what();
      return nullptr;
    }
  }();
  why = error;
  return bpe.get();
}

void skip(benchmark::State& state, const std::string& why) { state.SkipWithError(why.c_str()); }

void encode_bytes(benchmark::State& state, const Gpt2Bpe& bpe, const std::string& text) {
  std::size_t tokens = 0;
  for (auto _ : state) {
    const auto ids = bpe.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes/token"] = static_cast<double>(text.size()) / static_cast<double>(tokens ? tokens : 1);
}

void text(benchmark::State& state, const char* file) {
  std::string why;
  const Gpt2Bpe* bpe = tokenizer(why);
  const fs::path path = corpus_dir() / file;
  if (!bpe || !fs::is_regular_file(path)) {
    skip(state, (bpe ? path.string() + " is missing" : why) + "; run scripts/fetch-corpus --gpt2-bpe");
    return;
  }
  encode_bytes(state, *bpe, read_text(path));
}

void spacefree(benchmark::State& state) {
  std::string why;
  const Gpt2Bpe* bpe = tokenizer(why);
  const fs::path path = corpus_dir() / "austen.txt";
  if (!bpe || !fs::is_regular_file(path)) {
    skip(state, (bpe ? path.string() + " is missing" : why) + "; run scripts/fetch-corpus --gpt2-bpe");
    return;
  }
  std::string letters;
  for (const char c : read_text(path))
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) letters += c;
  const auto n = static_cast<std::size_t>(state.range(0));
  std::string piece;
  piece.reserve(n);
  while (piece.size() < n) piece.append(letters, 0, n - piece.size());
  encode_bytes(state, *bpe, piece);
}

void run(benchmark::State& state) {
  std::string why;
  const Gpt2Bpe* bpe = tokenizer(why);
  if (!bpe) {
    skip(state, why + "; run scripts/fetch-corpus --gpt2-bpe");
    return;
  }
  encode_bytes(state, *bpe, std::string(static_cast<std::size_t>(state.range(0)), 'a'));
}

}  // namespace

BENCHMARK_CAPTURE(text, austen, "austen.txt")->Name("tokenizer/text/austen")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(text, kjv, "kjv.txt")->Name("tokenizer/text/kjv")->Unit(benchmark::kMillisecond);
BENCHMARK(spacefree)->Name("tokenizer/spacefree")->Arg(1 << 16)->Arg(1 << 20)->Arg(10 << 20)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(run)->Name("tokenizer/run")->Arg(1 << 20)->Arg(10 << 20)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
